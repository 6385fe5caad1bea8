"""What one invocation of train.py does with its run folder (--resume, --overwrite,
--allow_changes, --stop_at_step) is no setting of the run: a run's config.json never records it,
so a config.json used as a config for another run (or for the same one) carries none of it: it
cannot start over a run it does not name with --overwrite, stop where another invocation stopped,
or ask to resume a run that has no checkpoint."""
from helpers import TINY_RUN, train_here

RUN = [*TINY_RUN, "--log_interval=1", "--batch_size=2", "--micro_batch_size=2", "--max_steps=4"]


def files_of(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_config_json_of_a_run_started_with_overwrite_destroys_no_run(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}"]
    train_here(*common, "--run_name=a5", "--overwrite")
    train_here(*common, "--run_name=victim", "--checkpoint_interval=2")
    victim = tmp_path / "victim"
    (victim / "results.json").write_text("{}\n")  # as python -m eval leaves it beside the checkpoints
    before = files_of(victim)
    assert {"ckpt_00000002.pt", "ckpt_00000004.pt", "metrics.jsonl", "results.json"} <= before.keys()

    config = str(tmp_path / "a5" / "config.json")
    for argv, folder in (([config, "--run_name=victim"], victim), ([config], tmp_path / "a5")):
        refused = train_here(*argv, check=False)  # a plain start into a folder that holds a run
        assert refused.returncode == 1
        assert f"the run folder {folder} already holds a run" in refused.stderr
    assert files_of(victim) == before


def test_a_config_json_of_a_stopped_or_resumed_run_starts_a_whole_new_run(byte_shards, tmp_path):
    common = [*RUN, f"--data_dir={byte_shards}", f"--out_dir={tmp_path}", "--run_name=r"]
    config = str(tmp_path / "r" / "config.json")
    train_here(*common, "--stop_at_step=2")
    copy = train_here(config, "--run_name=copy")  # not stopped where that invocation stopped
    assert f"{tmp_path / 'copy'}/ckpt.pt (step 4 of 4)" in copy.stdout
    train_here(*common, "--resume")
    fresh = train_here(config, "--run_name=fresh", check=False)  # no --resume asked, none carried
    assert fresh.returncode == 0, fresh.stderr
    assert "resumed" not in fresh.stdout and f"{tmp_path / 'fresh'}/ckpt.pt (step 4 of 4)" in fresh.stdout
