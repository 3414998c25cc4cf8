"""Tables of the rollout_corr/* metrics of the runs given as arguments (markdown on stdout)."""
import json, sys
KEYS = ["rollout/version_lag", "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/ratio_min", "rollout_corr/ratio_max",
        "rollout_corr/log_ppl_abs_diff", "rollout_corr/chi2_seq", "rollout_corr/rollout_is_mean",
        "rollout_corr/truncated_fraction", "rollout_corr/rollout_is_oob_ratio", "rollout_corr/rollout_rs_masked_fraction",
        "rollout_corr/rollout_rs_seq_masked_fraction", "rollout_corr/masked_fraction", "rollout_corr/rollout_is_eff_sample_size", "kept_fraction"]
for folder in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f"{folder}/metrics.jsonl")]
    rows = [r for r in rows if "loss" in r]
    keys = [k for k in KEYS if k in rows[0]]
    print(f"\n### {folder.rstrip('/').split('/')[-1]}\n")
    print("| step | " + " | ".join(k.replace("rollout_corr/", "") for k in keys) + " |")
    print("|---:|" + "---:|" * len(keys))
    pick = rows if len(rows) <= 10 else [r for r in rows if r["step"] in (1, 2, 3, 5, 10, 20, 30, 40, 50, 60)]
    for r in pick:
        print(f"| {r['step']} | " + " | ".join(f"{r[k]:.4g}" for k in keys) + " |")
