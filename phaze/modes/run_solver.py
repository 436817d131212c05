"""`phaze run_solver`: the co-design search of `phaze.search_run` on the command line; prints its
summary, and exits as the run ended (interrupted: 130; nothing fits: 2)."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from phaze import interrupt, results
from phaze.console import setup_logging, show
from phaze.search_run import execute
from phaze.settings import Settings
from phaze.sweep import Infeasible
from solver.layout import Layout


def run(settings: Settings) -> None:
    setup_logging()
    directory = Path(HydraConfig.get().runtime.output_dir)
    summary = execute(settings, directory)
    report(summary, directory)
    if not summary["complete"]:
        raise interrupt.Interrupted(f"what was done is in {directory}, marked incomplete")
    infeasible = [s for s in summary["per_setting"] if not s.get("feasible")]
    if infeasible:
        raise Infeasible(infeasible[0]["reason"])


def baseline_text(baseline: dict) -> str:
    """A baseline's speed-up in the summary, or why it cannot run."""
    if baseline.get("speedup"):
        return f"{baseline['speedup']:.2f}x"
    reason = baseline.get("infeasible_reason") or baseline.get("reason")
    return f"infeasible ({reason})" if reason else "infeasible"


def report(summary: dict, directory: Path) -> None:
    """The summary: one line (and its time breakdown) per setting, printed unwrapped and logged."""
    for setting in summary["per_setting"]:
        head = f"micro-batch {setting['micro_batch_size']}, HBM {setting['hbm_size_gib']:.4g} GiB"
        if not setting.get("complete", True) and setting.get("architectures_evaluated"):
            head += " (interrupted: the best of those evaluated)"
        if not setting.get("feasible"):
            show(f"{head}: {setting.get('reason', 'interrupted')}")
            continue
        accelerator, placement = setting["accelerator"], setting["placement"]
        chip = accelerator.get("name") or (
            f"{accelerator['num_tc']} TC {accelerator['tc_width']}x{accelerator['tc_depth']}, {accelerator['num_vc']} VC, "
            f"{accelerator['glb_bytes'] // 2**20} MiB ({accelerator['area'] / 1e6:.1f} mm²)")
        layout = Layout(**{name: placement[name] for name in results.LAYOUT_FIELDS})
        line = (f"{head}: {setting['throughput']:.1f} samples/s on {chip}; {layout.text()}, "
                f"recompute={placement['recompute']}; {setting['architectures_evaluated']} architectures evaluated")
        time = setting["time_per_batch_s"]
        line += "\n  time per batch " + f"{time:.4g} s = " + " + ".join(
            f"{name.replace('_', ' ')} {seconds:.3g}" for name, seconds in setting["breakdown_s"].items() if seconds)
        for name, baseline in setting.get("baselines", {}).items():
            line += f"; vs {name}: {baseline_text(baseline)}"
        show(line)
    show(f"results: {directory}")
