"""One in-process federated run (1 rank) through the library: what the round loop must guarantee."""

import json

import torch

from fedur.main import parse_config, run
from fedur.model.clip import load_clip


def test_smoke_run_trains_only_prompts_and_keeps_text_prompts_personal(tmp_path):
    run_dir = tmp_path / "run"
    cfg, config_yaml = parse_config(
        ["--config", "configs/smoke.yaml", "--federation.rounds", "2", "--run.output_dir", str(run_dir)]
    )
    result = run(cfg, config_yaml)

    torch.manual_seed(cfg.run.seed)
    fresh = load_clip(cfg.model.name, cfg.model.pretrained)
    trained = result.tuner.model.clip.state_dict()
    assert trained.keys() == fresh.model.state_dict().keys()
    assert all(torch.equal(trained[k], v) for k, v in fresh.model.state_dict().items()), "backbone changed"

    texts = [c.text_ctx for c in result.clients]
    assert len(texts) == 4
    assert all(not torch.equal(texts[i], texts[j]) for i in range(4) for j in range(i)), "text prompts were shared"
    global_visual = result.global_prompts["visual"]
    assert set(result.global_prompts) == {"visual"}  # FedUR shares the visual prompt only
    assert all(torch.equal(c.visual, global_visual) for c in result.clients)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    row = rows[0]
    assert len(row["client_accuracy"]) == 4 and len(row["bytes_sent"]) == 4 and row["refreshed"]
    visual_bytes = global_visual.numel() * 4
    assert row["bytes_sent"][0] == visual_bytes + 2 * 5 * 8  # prompt + two C-vectors of int64 at a refresh
    assert rows[1]["bytes_sent"][0] == visual_bytes
    assert row["selected"] == [len(c.pseudo_labels.labels) for c in result.clients]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["final_mean_accuracy"] == rows[-1]["mean_accuracy"]
    saved = torch.load(run_dir / "prompts" / "client_002.pt", weights_only=True)
    assert torch.equal(saved["text_ctx"], texts[2]) and torch.equal(saved["visual"], global_visual)
    assert torch.equal(torch.load(run_dir / "prompts" / "global.pt", weights_only=True)["visual"], global_visual)
