"""Widget keys the app reads or sets through `st.session_state` (Streamlit needs them as strings),
in one place. Everything else a session keeps is in its typed AppState (ui/state.py); the
sidebar's generation settings have their keys in ui/sidebar_settings.py's table."""

# The sidebar
MODEL_SOURCE = "model_source"  # Hugging Face id or local folder (local only)
KEPT_MODEL = "kept_model"  # the model box and weights last written to the session's record
FOUND_MODEL = "found_model"  # a GGUF file found on this machine (local only): sets MODEL_SOURCE
MODEL_FOLDERS = "model_folders"  # folders the user adds to that search
WEIGHTS = "weights_variant"  # the weights variant
PRESENT = "present"  # presentation mode (mirrored in the URL as ?present=1)
CHART_FORMAT = "chart_format"  # what a chart's camera icon saves: "png" or "svg"

# Generate (the prompt box is also a kept value: a reload restores it)
PROMPT = "prompt"
SAMPLE = "sample"  # the sample-prompt picker
UPLOAD = "upload"  # a trace file to replay
REPLAY_SPEED = "replay_speed"
LENS_ON = "lens_on"  # Generate's logit lens: read the layers of the picked step
STEP = "pick"  # the generated token "Why this token?" explains (a share link presets it)

# Attention (a share link presets the layer and head)
LAYER, HEAD = "attn_layer", "attn_head"
MODEL_VIEW = "model_view"  # the model view chart: its selection opens a layer and head

# KV cache
KV_TAB = "kv_tab"  # the tab open (its English name): kept through presentation mode and language

# Compare runs (run A's choice is a kept value)
COMPARE_A = "compare_a"
COMPARE_UPLOAD = "compare_upload"

# Step by step
STORY_STAGE = "story_stage"  # the stage picker
STORY_NEXT, STORY_PREVIOUS = "story_next", "story_previous"  # buttons the keyboard script clicks
STORY_FIGURE = "story_figure"  # the stage's notice and figure, which the keys scroll into view

# Embeddings
EMB_PICK, EMB_PROBE = "emb_pick", "emb_probe"  # the token picker and the probe box

# Serving: the form a sample stream fills
SERVING_STREAM = "serving_stream"
SERVING_PROMPTS = "serving_prompts"
SERVING_PREFIX = "serving_prefix"
SERVING_LENGTHS = "serving_lengths"
SERVING_COUNT = "serving_count"
SERVING_BATCH = "serving_batch"

# Serving engine
REMOTE_PROMPTS = "remote_prompts"

# The language (mirrored in the URL as ?lang=zh-Hant / zh-Hans / en)
LANG = "lang"
FILES_ASKED = "files_asked"  # the Generate page's "Prepare the downloads" button
