"""Importing the engine has no side effects: no environment change, no registration with
transformers until a recording needs it; entry points choose offline mode themselves.

Each check runs in a fresh interpreter, since this test process has long imported everything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> str:
    """Run `code` in a new interpreter from the repository root without HF_HUB_OFFLINE set;
    returns its stdout (fails the test with its stderr if it fails)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def every_engine_module() -> list[str]:
    """One fresh interpreter imports every engine module (an import of torch and transformers
    costs seconds: both checks below share it). Line 1: every write to os.environ during the
    imports, attributed to the first non-stdlib frame that made it (torch may set its own
    variables when the engine imports it, the engine none). Line 2: whether the recording
    attention is registered with transformers after all those imports and after a recording."""
    return run_fresh("""
        import importlib, os, pkgutil, sysconfig, traceback

        stdlib, writes = sysconfig.get_paths()["stdlib"], []

        def writer():
            for frame in reversed(traceback.extract_stack()[:-2]):
                if not frame.filename.startswith((stdlib, "<")):
                    return frame.filename
            return ""

        environ = type(os.environ)
        set_item, del_item = environ.__setitem__, environ.__delitem__
        environ.__setitem__ = lambda self, k, v: writes.append((k, writer())) or set_item(self, k, v)
        environ.__delitem__ = lambda self, k: writes.append((k, writer())) or del_item(self, k)

        import engine
        names = [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")
                 if m.name != "engine.__main__"]
        for name in names:
            importlib.import_module(name)
        root = os.path.dirname(engine.__file__)
        print(len(names), sorted({k for k, f in writes if f.startswith(root)}))

        import torch
        from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        from engine.attention import RECORDING_ATTENTION, AttentionRecorder, recording

        def known():
            return (RECORDING_ATTENTION in AttentionInterface(),
                    RECORDING_ATTENTION in ALL_MASK_ATTENTION_FUNCTIONS)

        after_import = known()
        config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                             attn_implementation="sdpa")
        model = LlamaForCausalLM(config).eval()
        with torch.inference_mode(), recording(model, AttentionRecorder()) as recorder:
            model(input_ids=torch.tensor([[1, 2, 3]]))
        print(after_import, known(), tuple(recorder.captured[0].shape),
              model.config._attn_implementation)
    """).splitlines()


def test_importing_the_engine_changes_no_environment_variable(every_engine_module):
    count, ours = every_engine_module[0].split(" ", 1)
    assert int(count) > 20 and ours.strip() == "[]"


def test_the_package_alone_imports_nothing_heavy():
    """So an entry point can still set the environment after `import engine`."""
    out = run_fresh("""
        import sys
        import engine
        from engine import EngineError  # a name is imported on first access
        print(sorted(m for m in ("torch", "transformers", "huggingface_hub") if m in sys.modules))
    """)
    assert out.strip() == "[]"


def test_the_cli_entry_point_chooses_offline_before_the_hub_reads_it():
    out = run_fresh("""
        import engine.__main__
        import huggingface_hub.constants as hub
        print(hub.HF_HUB_OFFLINE)
    """)
    assert out.strip() == "True"


def test_recording_attention_registers_only_when_first_used(every_engine_module):
    """No engine module registers it when imported; the first recording does."""
    assert every_engine_module[1].strip() == "(False, False) (True, True) (1, 2, 3, 3) sdpa"


def test_ceilings_live_in_a_leaf_module():
    out = run_fresh("""
        import sys
        from engine.kernels.ceilings import Ceilings
        heavy = sorted(m for m in ("torch", "engine.loader", "engine.runner") if m in sys.modules)
        from engine.kernels.microbench import Ceilings as again
        print(heavy, again is Ceilings)
    """)
    assert out.strip() == "[] True"
