"""The quality report's figure: per-layer weight SQNR of each online quantization scheme."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence


def plot(path: pathlib.Path, layers: Sequence[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.DataFrame(layers)
    fig, ax = plt.subplots(figsize=(10, 4))
    for scheme, part in frame.groupby("scheme", sort=False):
        ax.plot(range(len(part)), part["sqnr_db"].to_numpy(), marker=".", label=scheme)
    ax.set_xlabel("linear layer (model order: qkv, o, gate_up, down per decoder layer)")
    ax.set_ylabel("weight SQNR (dB)")
    ax.set_title("Online quantization of the embedded model: per-layer weight SQNR")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_decode(path: pathlib.Path, rows: Sequence[dict]) -> None:
    """Output (decode) and prompt (prefill) tok/s of each scheme as a ratio to bf16, per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame["case"] = frame["workload"].where(frame["workload"] != "decode", "decode b=" + frame["batch"].astype(str))
    table = frame.pivot_table(index="case", columns="scheme", values="vs_bf16", sort=False)
    fig, ax = plt.subplots(figsize=(9, 4))
    table.plot.bar(ax=ax, rot=0)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("tok/s / bf16 tok/s (same run)")
    ax.set_title("Quantized runner vs bf16 (Llama-3.1-8B shape, dummy weights)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
