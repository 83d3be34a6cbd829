"""strategy=auto trains the planner's layout on 2 ranks, with the single-process losses."""

import baselines

from lightning_dist.run.parity_runs import max_relative_difference


def test_strategy_auto_runs_the_planners_layout(train_in, tmp_path):
    common = ["debug=fast", "trainer.max_steps=4"]
    auto = train_in([*common, "strategy=auto", "hardware.devices=2"], tmp_path / "auto")
    single = baselines.reference([*common, "strategy=single"])
    assert auto["strategy"] == "auto" and auto["world_size"] == 2
    assert (
        auto["layout"]["pp"]
        * auto["layout"]["tp"]
        * auto["layout"]["dp_shard"]
        * auto["layout"]["dp_replicate"]
        == 2
    )
    assert max_relative_difference(single["losses"], auto["losses"]) < 1e-4
