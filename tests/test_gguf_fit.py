"""Whether a GGUF fits is decided before anything loads, against the memory really available.

The container's limit counts (cgroup v2 `memory.max` less `memory.current`, or v1's files) where
it is smaller than the host's free memory: in a 6 GiB container a 1B model that the host's 20 GB
would take must be measured against 6 GiB. A model that does not fit is one line — what it needs
(weights as stored + KV cache + buffers) and what is available — exit status 2 on the CLI.
"""

from __future__ import annotations

import pytest

from engine.gguf import fit

GIB = 2**30


def _cgroup(tmp_path, monkeypatch, limit: str, usage: int):
    (tmp_path / "memory.max").write_text(limit + "\n")
    (tmp_path / "memory.current").write_text(f"{usage}\n")
    monkeypatch.setattr(fit, "_CGROUP_V2", tmp_path)
    monkeypatch.setattr(fit, "_CGROUP_V1", tmp_path / "absent")
    monkeypatch.setattr(fit, "_own_cgroups", lambda: [("v2", "/")])


def test_a_container_limit_below_the_hosts_free_memory_is_what_counts(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, str(6 * GIB), 1 * GIB)
    monkeypatch.setattr(fit, "host_available", lambda: 20 * GIB)
    memory = fit.available_memory()
    assert memory == fit.Memory(5 * GIB, "container limit")


def test_no_limit_or_a_larger_one_leaves_the_hosts_free_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(fit, "host_available", lambda: 20 * GIB)
    _cgroup(tmp_path, monkeypatch, "max", 0)
    assert fit.available_memory() == fit.Memory(20 * GIB, "free memory")
    _cgroup(tmp_path, monkeypatch, str(64 * GIB), GIB)
    assert fit.available_memory() == fit.Memory(20 * GIB, "free memory")


def test_a_limit_on_the_processs_own_cgroup_or_a_parent_counts(tmp_path, monkeypatch):
    """Outside a container the limit sits on the process's own (v1) cgroup or a parent of it,
    not on the hierarchy's root: the tightest room among them is what counts."""
    own = tmp_path / "memory" / "app" / "run"
    own.mkdir(parents=True)
    for folder, limit, usage in ((tmp_path / "memory", 2**63 - 4096, 0),
                                 (tmp_path / "memory" / "app", 6 * GIB, 2 * GIB),
                                 (own, 16 * GIB, 1 * GIB)):
        (folder / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (folder / "memory.usage_in_bytes").write_text(f"{usage}\n")
    monkeypatch.setattr(fit, "_CGROUP_V1", tmp_path / "memory")
    monkeypatch.setattr(fit, "_CGROUP_V2", tmp_path / "absent")
    monkeypatch.setattr(fit, "_own_cgroups", lambda: [("v1", "/app/run")])
    assert fit.container_limit() == (6 * GIB, 2 * GIB)
    monkeypatch.setattr(fit, "host_available", lambda: 20 * GIB)
    assert fit.available_memory() == fit.Memory(4 * GIB, "container limit")


def test_the_kv_cache_is_the_formula():
    # Llama 3.1 8B at 4096 positions: 2 · 32 layers · 8 KV heads · 128 · 4 bytes · 4096
    assert fit.kv_bytes(32, 8, 128, 4096) == 2 * 32 * 8 * 128 * 4 * 4096 == 1 << 30


def test_a_model_that_does_not_fit_is_one_line_naming_both_figures():
    cost = fit.need(4_920_000_000, 32, 8, 128, 4096)
    line = fit.fit_problem("8b.gguf", cost, fit.Memory(5 * GIB, "container limit"))
    assert line is not None and "\n" not in line
    assert line.startswith("8b.gguf needs 6.3 GB (4.9 GB of weights as stored + 1.1 GB of KV")
    assert "only 5.4 GB is available (container limit): 0.9 GB more is needed" in line
    assert fit.fit_problem("8b.gguf", cost, fit.Memory(16 * GIB, "free memory")) is None


def test_the_line_is_in_the_sessions_language():
    import i18n

    cost = fit.need(4_920_000_000, 32, 8, 128, 4096)
    with i18n.using("zh-Hant"):
        line = fit.fit_problem("8b.gguf", cost, fit.Memory(5 * GIB, "container limit"))
    assert line == ("8b.gguf 需要 6.3 GB（檔案所存的權重 4.9 GB + KV 快取 1.1 GB + 工作與記錄緩衝區 "
                    "0.3 GB），但只有 5.4 GB 可用（容器的記憶體上限）：還差 0.9 GB")


@pytest.mark.real_model
def test_the_cli_refuses_a_file_too_big_for_the_container_before_loading(monkeypatch, capsys):
    from engine.__main__ import main
    from engine.loader import default_gguf_path

    monkeypatch.setattr(fit, "available_memory", lambda: fit.Memory(200 * 2**20, "container limit"))
    assert main(["run", "Hi", "--model", str(default_gguf_path()), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs" in err[0] and "(container limit)" in err[0]
