"""A path the user gives that cannot be read or written ends in one clear line and exit status 2, in every command."""

import pytest

from functional_gan.main import main
from tests.helpers import TINY, tiny_flags

# A path below a regular file: no folder can be made there, whatever the user's permissions.
COMMANDS = {
    "train": lambda bad, tmp: ["train", *tiny_flags(steps=1), "--out", str(bad)],
    "sample": lambda bad, tmp: ["sample", "--generator", str(tmp / "G.pt"), "--num", "4", "--out", str(bad / "grid.png")],
    "export": lambda bad, tmp: ["export", "--checkpoint", str(tmp / "run"), "--generator", str(bad / "G.pth")],
    "lessons": lambda bad, tmp: ["lessons", "detach", "--markdown", str(bad / "lessons.md")],
    # (linreg writes nothing; diverge reads only.)
    "bench": lambda bad, tmp: ["bench", "--quick", "--json", str(bad / "bench.json")],  # refused before any timing
    "graph": lambda bad, tmp: ["graph", "dstep", "--out", str(bad)],
    "replay": lambda bad, tmp: ["replay", "--generator", str(tmp / "G.pt"), "--discriminator", str(tmp / "D.pt"),
                                "--batches", str(tmp / "missing.npz"), "--out", str(bad / "m.npz")],
    "compare": lambda bad, tmp: ["compare", "--only", "fixtures", "--out", str(bad)],
    "check-port": lambda bad, tmp: ["check-port", "examples/port/mnist_cnn.py", "--json", str(bad / "r.json")],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unusable_path_is_one_line_and_exit_2(command, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    if command in ("sample", "replay"):
        import torch

        from functional_gan.comparisons.common import SMALL_WIDTHS
        from functional_gan.pytorch import dcgan

        net_g, net_d = dcgan.make_models(SMALL_WIDTHS)
        torch.save(net_g.state_dict(), tmp_path / "G.pt")
        torch.save(net_d.state_dict(), tmp_path / "D.pt")
    if command == "export":  # a run folder with one checkpoint, written as `train` writes its checkpoints
        from functional_gan import checkpoints
        from functional_gan.train import init_state

        manager = checkpoints.checkpoint_manager(tmp_path / "run" / "checkpoints")
        checkpoints.save(manager, init_state(TINY), TINY)
        manager.wait_until_finished()
    code = main(COMMANDS[command](blocker / "sub", tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"functional-gan {command}: error: ") and "Traceback" not in err[0], err
    assert blocker.read_text() == "not a folder"  # nothing the user had is touched
