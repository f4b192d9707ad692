"""The quality report's figure: per-layer weight SQNR of each online quantization scheme."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence


def plot(path: pathlib.Path, layers: Sequence[dict], rows: Sequence[dict] = ()) -> None:
    """Per-layer weight SQNR of each scheme; beside it (where `rows` has them) each model's perplexity as a
    ratio to the bf16 model's, with its 95 % interval and the 1.02x line of the FP8 bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    frame = pd.DataFrame(layers)
    ratios = pd.DataFrame([r for r in rows if "vs_bf16_ci95_low" in r])
    panels = 2 if len(ratios) else 1
    fig, axes = plt.subplots(1, panels, figsize=(10 + 5 * (panels - 1), 4), squeeze=False)
    ax = axes[0][0]
    for scheme, part in frame.groupby("scheme", sort=False):
        ax.plot(range(len(part)), part["sqnr_db"].to_numpy(), marker=".", label=scheme)
    ax.set_xlabel("linear layer (model order: qkv, o, gate_up, down per decoder layer)")
    ax.set_ylabel("weight SQNR (dB)")
    ax.set_title("Online quantization of the embedded model: per-layer weight SQNR")
    ax.grid(alpha=0.3)
    ax.legend()
    if panels == 2:
        ax = axes[0][1]
        y = range(len(ratios))
        mid = ratios["perplexity_vs_bf16"].to_numpy()
        errors = [mid - ratios["vs_bf16_ci95_low"].to_numpy(), ratios["vs_bf16_ci95_high"].to_numpy() - mid]
        ax.errorbar(mid, y, xerr=errors, fmt="o", capsize=3)
        ax.axvline(1.02, color="r", lw=0.8, ls="--", label="fp8 bar (1.02x)")
        ax.set_yticks(list(y), ratios["scheme"].tolist())
        ax.invert_yaxis()
        ax.set_xscale("log")
        ticks = [t for t in (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0) if t <= max(ratios["vs_bf16_ci95_high"])]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("perplexity / bf16 model's (95 % interval)")
        ax.set_title("Perplexity against the bf16 model")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
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
