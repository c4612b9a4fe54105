"""The kernel table (Prefill vs decode page): MBU is a percent like every other MBU in the app,
and the columns round what they show, not the values (no model needed: a made-up comparison)."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest


def kernel_table_script() -> None:
    from types import SimpleNamespace

    from engine.kernels.ceilings import Ceilings
    from engine.timing.roofline import Work
    from ui.sections.timing_kernels import kernel_table

    steps = {"eager": 41.237, "native C": 9.8765}
    comparison = SimpleNamespace(steps=steps, work=Work(2.7e8, 5.4e8),
                                 speedup=lambda name: steps["eager"] / steps[name])
    kernel_table(comparison, Ceilings("cpu", 60.0, 1.0, "float32", "now"))


def test_mbu_is_a_percent_and_columns_round_what_they_show():
    at = AppTest.from_function(kernel_table_script, default_timeout=60).run()
    assert not at.exception
    [table] = at.dataframe
    columns = json.loads(table.proto.columns)
    formats = {name: c.get("type_config", {}).get("format") for name, c in columns.items()}
    assert formats["MBU"] == "percent"  # 0.911 reads 91.1 %, as in the work and quantization tables
    assert formats["ITL (ms)"] == formats["tokens/s"] == formats["achieved GB/s"] == "%.1f"
    assert formats["× eager"] == "%.2f×"
    frame = table.value
    # the values stay exact: MBU = bytes / ITL / bandwidth, a share (not a rounded one)
    native = frame[frame["decode step"] == "native C"].iloc[0]
    assert native["MBU"] == 5.4e8 / (9.8765 / 1000) / 60e9
    assert native["ITL (ms)"] == 9.8765 and native["× eager"] == 41.237 / 9.8765
