"""The system space's co-designed chip next to TPU v4, H100 and B200 at their power and at their cost
(the README's table): for each model, the known chip's best placement on its own system, and the
search of `architecture_space=system` on the same system with the known chip's peak power, then its
cost, as the budget. Prints one markdown row per case; each run's files go to outputs/equal_budgets/.

TPU v4's peak power and cost are the model's (phaze_hardware/power.py, phaze_hardware/cost.py: the tpuv4
template with 4 HBM2 stacks and 6 ICI links, 233.5 W and $1,070); H100's and B200's are published:
700 W (NVIDIA H100 datasheet) and $3,320 (its bill of materials: Raymond James via Barron's, as
phaze_hardware/offchip.yaml cites it), with H100's 814 mm² die as the area budget; 1,000 W (NVIDIA DGX
B200 datasheet, per GPU) and $6,400 (Silicon Analysts, "NVIDIA B200 cost breakdown": its
manufacturing cost, of which $2,900 HBM3E as offchip.yaml cites it), with B200's two dies of about
800 mm² each (the same analysis: 1,600 mm²) as the area budget. Both GPUs train in BF16 here, as the
template does (its area and energy model has 16-bit multiply-accumulates only). The candidates are
priced as the validated TPUs are (`accelerator.core_buffer_words_per_cycle=256`,
`accelerator.tensor_core_efficiency=0.74`: a systolic array's feed and the efficiency fitted on
MaxText's runs), so the co-designed chip and TPU v4 are priced alike.
Run from the repository root: python scripts/equal_budgets.py [--models megatrongpt3 llama3-70b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import phaze  # noqa: E402
from phaze_hardware import KNOWN_CHIPS  # noqa: E402
from phaze_hardware.cost import cost_model  # noqa: E402
from phaze_hardware.offchip import Memory, ScaleUp  # noqa: E402
from phaze_hardware.power import power_model  # noqa: E402

OUTPUT = Path("outputs/equal_budgets")
#: The validated TPUs' technology for every candidate (phaze_hardware/templates/tpuv4.yaml).
VALIDATED = {"accelerator.core_buffer_words_per_cycle": 256, "accelerator.tensor_core_efficiency": 0.74}
#: The GPUs beside which the co-designed chip is searched: (name, system, chip, peak power [W], cost [$],
#: die area [µm²]) (module docstring for the sources).
GPUS = (("H100", "dgx_h100", "h100_sxm", 700.0, 3320.0, 814e6),
        ("B200", "dgx_b200", "b200", 1000.0, 6400.0, 1600e6))


def tpu_v4_budgets() -> tuple[float, float]:
    """TPU v4's peak power [W] and cost [$] by the model."""
    chip, memory, links = KNOWN_CHIPS["tpuv4"].template, Memory.of("hbm2", 4), ScaleUp.of("ici_v4", 6, 64)
    power = power_model().peak_power(chip, "n7", memory, links)["total"]
    return power, float(cost_model().chip_cost(chip.area + memory.area + links.area, "n7", memory))


def chip_text(setting: dict) -> str:
    a = setting["accelerator"]
    if "name" in a:
        return a["name"]
    return (f"{a['num_tc']} TC {a['tc_width']}x{a['tc_depth']}, {a['num_vc']} VC, {a['glb_bytes'] // 2**20} MiB, "
            f"{a['hbm_stacks']}x {a['hbm_generation']}, {a['links']}x {a['link_generation']} "
            f"({a['die_area'] / 1e6:.0f} mm², {setting['power_w']:.0f} W, ${setting['cost_usd']:,.0f})")


def run(name: str, model: str, **keys) -> dict:
    best = phaze.search(model, OUTPUT / name, micro_batch_size=1, **keys).best
    (setting,) = best["per_setting"]
    placement = setting["placement"]
    layout = (f"t{placement['tensor_parallel_width']} p{placement['pipeline_parallel_width']} "
              f"d{placement['data_parallel_width']} v{placement['virtual_stages']}, {placement['recompute']}")
    return {"throughput": setting["throughput"], "chip": chip_text(setting), "layout": layout,
            "validated_tpuv4": setting.get("baselines", {}).get("tpuv4", {}).get("throughput")}


#: The system space with TPU v4's own memory or links only (`--limits`).
LIMITS = {
    "the whole space": {},
    "HBM as TPU v4's (HBM2, at most 4 stacks)": {"system_space.hbm_generations": ["hbm2"],
                                                 "system_space.hbm_stacks": [1, 2, 3, 4]},
    "links as TPU v4's (6 ICI)": {"system_space.link_generations": ["ici_v4"], "system_space.links": [6]},
    "both": {"system_space.hbm_generations": ["hbm2"], "system_space.hbm_stacks": [1, 2, 3, 4],
             "system_space.link_generations": ["ici_v4"], "system_space.links": [6]},
}


def limits(model: str) -> None:
    """What the search chooses when the HBM or the links are limited to TPU v4's."""
    print("| space | samples/s | chip (die, peak power, cost) | layout |")
    print("|---|---|---|---|")
    for name, keys in LIMITS.items():
        slug = "-".join(str(value) for value in keys.values()).replace(" ", "")
        found = run(f"{model}-limits-{slug or 'all'}", model, architecture_space="system", **keys, **VALIDATED)
        print(f"| {name} | {found['throughput']:.1f} | {found['chip']} | {found['layout']} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["megatrongpt3", "llama3-70b"])
    parser.add_argument("--known", nargs="+", default=["TPU v4", "H100", "B200"], help="the chips beside which to search")
    parser.add_argument("--limits", action="store_true", help="the HBM or links limited to TPU v4's (the first model)")
    arguments = parser.parse_args()
    if arguments.limits:
        limits(arguments.models[0])
        return
    power, cost = tpu_v4_budgets()
    print(f"TPU v4 by the model: {power:.1f} W peak, ${cost:,.0f}", flush=True)
    print("| model | known chip | budget | its samples/s | co-designed samples/s | x | co-designed chip | layout |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [("TPU v4", "tpuv4_pod", None, {"power_budget": power, "cost_budget": cost}, {})]
    cases += [(name, system, chip, {"power_budget": watts, "cost_budget": dollars}, {"area_budget": die})
              for name, system, chip, watts, dollars, die in GPUS]
    for model in arguments.models:
        for known, system, chip, budgets, extra in cases:
            if known not in arguments.known:
                continue
            # the validated TPU v4 is each TPU system-space run's baseline; a GPU's own best placement is searched
            reference = None if chip is None else run(f"{model}-{chip}", model, system=system, chip=chip)["throughput"]
            for budget, value in budgets.items():
                found = run(f"{model}-{system}-{budget}", model, system=system, architecture_space="system",
                            **{budget: value}, **extra, **VALIDATED)
                own = reference if reference is not None else found["validated_tpuv4"]
                unit = "W" if budget == "power_budget" else "$"
                print(f"| {model} | {known} | {value:,.0f} {unit} | {own:.1f} | {found['throughput']:.1f} | "
                      f"{found['throughput'] / own:.2f} | {found['chip']} | {found['layout']} |", flush=True)


if __name__ == "__main__":
    main()
