#!/usr/bin/env python3
"""tprun's UniPCMultistepScheduler (and FlowMatchEulerDiscreteScheduler's own schedule, as WanPipeline
asks for it) against diffusers 0.40's own, built from the same configs: Wan's hub
config (flow_prediction, flow sigmas) at flow_shift 3 and 5, solver_order 1/2/3, disable_corrector,
bh1 and final_sigmas_type "sigma_min", dynamic shifting, shift_terminal, bf16 model outputs, and the
beta-schedule predictions (epsilon, v_prediction, sample; noise prediction; thresholding; rescaled
betas; leading / trailing spacing), over 1, 2, 3, 10 and 50 steps (and a few odd counts).

Per case: the timesteps equal, the sigmas within 1e-7, and a whole loop driven as WanPipeline drives
it (set_begin_index(0), one step per timestep) on seeded random model outputs, the same on both sides,
every step's sample within 1e-5 (relative to max(1, |sample|)). tprun's side is the unit-test binary's
UniPCSchedulerProbe, which reads the cases and outputs this script writes and runs make_scheduler.

Usage: unipc_parity.py <tprun_unit_tests>
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

UNIT = sys.argv[1] if len(sys.argv) > 1 else None
SHAPE = (1, 4, 2, 4, 4)  # [B, C, F, H, W]: a Wan latent, small
SIGMA_TOL = 1e-7
SAMPLE_TOL = 1e-5

# Wan2.1-T2V-*-Diffusers' scheduler/scheduler_config.json.
WAN = {
    "_class_name": "UniPCMultistepScheduler", "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001,
    "disable_corrector": [], "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 3.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True, "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False, "sample_max_value": 1.0, "solver_order": 2, "solver_p": None,
    "solver_type": "bh2", "steps_offset": 0, "thresholding": False, "timestep_spacing": "linspace",
    "trained_betas": None, "use_beta_sigmas": False, "use_exponential_sigmas": False, "use_flow_sigmas": True,
    "use_karras_sigmas": False}
BETA = {"_class_name": "UniPCMultistepScheduler"}  # diffusers' defaults: epsilon on the linear beta schedule
# FlowMatchEulerDiscreteScheduler where a Wan folder names it: its own schedule (no sigmas passed).
FLOW = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0}
STEPS = [1, 2, 3, 10, 50]


def variants():
    """(name, config, steps, extra) for every case."""
    v = [("wan_shift3", WAN, STEPS + [20], {}),
         ("wan_shift5", dict(WAN, flow_shift=5.0), STEPS + [250], {}),
         ("wan_order1", dict(WAN, flow_shift=5.0, solver_order=1), STEPS, {}),
         ("wan_order3", dict(WAN, flow_shift=5.0, solver_order=3), STEPS, {}),
         ("wan_disable_corrector", dict(WAN, disable_corrector=[0, 2, 5]), [3, 10], {}),
         ("wan_bh1_sigma_min", dict(WAN, solver_type="bh1", final_sigmas_type="sigma_min"), [1, 3, 10, 50], {}),
         ("wan_sigma_min_no_lower_final", dict(WAN, final_sigmas_type="sigma_min", lower_order_final=False),
          [2, 10], {}),
         ("wan_dynamic_shift", dict(WAN, use_dynamic_shifting=True), [2, 10], {"mu": 0.8}),
         ("wan_dynamic_linear", dict(WAN, use_dynamic_shifting=True, time_shift_type="linear"), [10], {"mu": 2.5}),
         ("wan_shift_terminal", dict(WAN, shift_terminal=0.05), [2, 10], {}),
         ("wan_bf16_outputs", WAN, [10], {"model_dtype": "bf16"}),
         ("epsilon", BETA, [1, 3, 10, 50], {}),
         ("epsilon_noise_pred", dict(BETA, predict_x0=False, final_sigmas_type="sigma_min"), [3, 10], {}),
         ("epsilon_thresholding", dict(BETA, thresholding=True, sample_max_value=1.5), [10], {}),
         ("v_trailing_scaled", dict(BETA, prediction_type="v_prediction", timestep_spacing="trailing",
                                    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), [10, 61], {}),
         ("v_rescaled_sigma_min", dict(BETA, prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                       timestep_spacing="trailing", final_sigmas_type="sigma_min"), [10], {}),
         ("sample_leading_cosine", dict(BETA, prediction_type="sample", timestep_spacing="leading", steps_offset=1,
                                        beta_schedule="squaredcos_cap_v2", solver_order=3), [3, 10], {}),
         ("v_noise_pred", dict(BETA, prediction_type="v_prediction", predict_x0=False, solver_order=3,
                               final_sigmas_type="sigma_min"), [10], {}),
         ("flow_match_shift3", FLOW, [1, 2, 10, 50], {}),
         ("flow_match_shift5_bf16", dict(FLOW, shift=5.0), [10], {"model_dtype": "bf16"}),
         ("flow_match_dynamic", dict(FLOW, use_dynamic_shifting=True), [10], {"mu": 1.1}),
         ("flow_match_dynamic_linear", dict(FLOW, use_dynamic_shifting=True, time_shift_type="linear"), [10],
          {"mu": 2.0}),
         ("flow_match_terminal_inverted", dict(FLOW, shift_terminal=0.02, invert_sigmas=True), [2, 10], {})]
    for name, config, steps_list, extra in v:
        for steps in steps_list:
            yield f"{name}_n{steps}", config, steps, extra


# Configs tprun refuses because diffusers' own loop comes out non-finite (unipc_scheduler.h; the
# refusals themselves: tests/unit/test_unipc_scheduler.cpp): checked here against diffusers.
NON_FINITE = [("bh1_zero", dict(WAN, solver_type="bh1")),
              ("noise_pred_zero", dict(BETA, predict_x0=False)),
              ("no_lower_final_zero", dict(WAN, lower_order_final=False)),
              ("no_lower_final_zero_beta", dict(BETA, lower_order_final=False)),
              ("order3_no_lower_final_sigma_min", dict(WAN, final_sigmas_type="sigma_min", lower_order_final=False,
                                                       solver_order=3))]


def diffusers_loop(config, steps, extra, sample, outputs):
    cls = FlowMatchEulerDiscreteScheduler if config["_class_name"] == FLOW["_class_name"] else UniPCMultistepScheduler
    s = cls.from_config({k: v for k, v in config.items() if k != "_class_name"})
    s.set_timesteps(steps, mu=extra.get("mu"))
    s.set_begin_index(0)  # as WanPipeline does
    x, samples = sample.clone(), []
    for i, t in enumerate(s.timesteps):
        v = outputs[i].to(torch.bfloat16) if extra.get("model_dtype") == "bf16" else outputs[i]
        x = s.step(v, t, x, return_dict=False)[0]
        samples.append(x.float())
    return s.timesteps, s.sigmas, torch.stack(samples)


def main():
    if not UNIT or not os.path.exists(UNIT):
        print(f"usage: unipc_parity.py <tprun_unit_tests> (given {UNIT!r})")
        return 2
    failures, count = [], 0
    worst_sigma = worst_sample = 0.0
    with tempfile.TemporaryDirectory(prefix="tprun-unipc-") as d:
        cases, inputs, expected = [], {}, {}
        gen = torch.Generator().manual_seed(1234)
        for name, config, steps, extra in variants():
            # at most one more step than asked (numpy's trailing arange)
            outputs = torch.randn((steps + 1,) + SHAPE, generator=gen)
            sample = torch.randn(SHAPE, generator=gen)
            expected[name] = diffusers_loop(config, steps, extra, sample, outputs)
            inputs[f"{name}.outputs"] = outputs
            inputs[f"{name}.sample"] = sample
            cases.append(dict({"name": name, "config": config, "steps": steps}, **extra))
        with open(os.path.join(d, "cases.json"), "w") as f:
            json.dump(cases, f)
        save_file(inputs, os.path.join(d, "inputs.safetensors"))
        env = dict(os.environ, TPRUN_UNIPC_PROBE=d)
        r = subprocess.run([UNIT, "--gtest_filter=UniPCSchedulerProbe.*", "--gtest_brief=1"], env=env,
                           capture_output=True, text=True, timeout=300)
        out_path = os.path.join(d, "outputs.safetensors")
        if r.returncode != 0 or "SKIPPED" in r.stdout or not os.path.exists(out_path):
            print(f"FAIL the probe: exit {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
            return 1
        got = load_file(out_path)
        for case in cases:
            name = case["name"]
            t_ref, s_ref, x_ref = expected[name]
            count += 1
            t, s, x = got[f"{name}.timesteps"], got[f"{name}.sigmas"], got[f"{name}.samples"]
            problems = []
            if t.shape != t_ref.shape or not torch.equal(t.double(), t_ref.double()):
                problems.append(f"timesteps {t[:6].tolist()}... vs diffusers {t_ref[:6].tolist()}... "
                                f"({t.numel()} vs {t_ref.numel()})")
            elif s.shape != s_ref.shape:
                problems.append(f"sigmas {s.numel()} vs diffusers {s_ref.numel()}")
            else:
                ds = (s.double() - s_ref.double()).abs().max().item()
                worst_sigma = max(worst_sigma, ds)
                if not ds <= SIGMA_TOL:
                    problems.append(f"sigmas differ by {ds:.3g}")
                if x.shape != x_ref.shape:
                    problems.append(f"samples {list(x.shape)} vs diffusers {list(x_ref.shape)}")
                else:
                    scale = x_ref.abs().amax(dim=tuple(range(1, x_ref.dim())), keepdim=True).clamp(min=1.0)
                    dx = ((x.double() - x_ref.double()).abs() / scale).max().item()
                    finite = bool(torch.isfinite(x_ref).all())
                    worst_sample = max(worst_sample, dx)
                    if not finite or not dx <= SAMPLE_TOL:
                        problems.append(f"samples differ by {dx:.3g} (relative; diffusers finite: {finite})")
            if problems:
                failures.append(name)
                print(f"FAIL {name}: " + "; ".join(problems))
    gen = torch.Generator().manual_seed(99)
    for name, config in NON_FINITE:
        _, _, x = diffusers_loop(config, 10, {}, torch.randn(SHAPE, generator=gen),
                                 torch.randn((11,) + SHAPE, generator=gen))
        if bool(torch.isfinite(x[-1]).all()):
            failures.append(name)
            print(f"FAIL {name}: tprun refuses this config as non-finite, but diffusers' 10-step loop is finite")
    print(f"{len(NON_FINITE)} refused configs checked non-finite in diffusers")
    print(f"{count - len(failures)} of {count} cases: timesteps equal, max |dsigma| {worst_sigma:.3g} "
          f"(tolerance {SIGMA_TOL:g}), max relative |dsample| over every step {worst_sample:.3g} "
          f"(tolerance {SAMPLE_TOL:g})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
