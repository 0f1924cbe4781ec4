"""Replay and weight conversion with files written by the tutorial's own code."""

import pickle

import numpy as np
import pytest
import torch

import dataclasses

from functional_gan import state_dicts
from functional_gan.comparisons.common import SMALL_WIDTHS, make_batches, max_state_difference
from functional_gan.main import main
from functional_gan.pytorch import dcgan as torch_reference
from functional_gan.pytorch.precision import default_dtype

SPEC = dataclasses.replace(SMALL_WIDTHS, steps=5, batch_size=4)


@pytest.fixture()
def tutorial_files(tmp_path):
    """netG/netD saved as the tutorial saves them, plus the batches its run used."""
    with default_dtype(torch.float64):
        net_g, net_d = torch_reference.make_models(dataclasses.replace(SPEC, seed=3), dtype=torch.float64)
        torch.save(net_g.state_dict(), tmp_path / "G.pt")
        torch.save(net_d.state_dict(), tmp_path / "D.pt")
        real, noise = make_batches(SPEC)
        np.savez(tmp_path / "B.npz", real=real, noise=noise)
        optimizer_g, optimizer_d = torch_reference.make_optimizers(net_g, net_d, SPEC)
        rows = [torch_reference.tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, torch.nn.BCELoss(),
                                                   torch.as_tensor(real[t]), torch.as_tensor(noise[t])) for t in range(SPEC.steps)]
    return tmp_path, np.array(rows), net_g, net_d


def test_replay_command_reproduces_the_tutorials_run(tutorial_files):
    folder, torch_rows, net_g, net_d = tutorial_files
    code = main(["replay", "--generator", str(folder / "G.pt"), "--discriminator", str(folder / "D.pt"),
                 "--batches", str(folder / "B.npz"), "--dtype", "float64", "--out", str(folder / "R.npz"),
                 "--out-generator", str(folder / "G2.pt"), "--out-discriminator", str(folder / "D2.pt")])
    assert code == 0
    with np.load(folder / "R.npz") as replayed:
        ours = np.stack([replayed[k] for k in ("loss_d", "loss_g", "d_x", "d_g_z1", "d_g_z2")], axis=1)
    np.testing.assert_allclose(ours, torch_rows, rtol=0, atol=1e-10)
    # The written state_dicts load straight into the tutorial's models, counters included.
    fresh_g = torch_reference.Generator(SPEC.nz, SPEC.ngf, SPEC.nc, SPEC.image_size).double()
    fresh_d = torch_reference.Discriminator(SPEC.ndf, SPEC.nc, SPEC.image_size).double()
    fresh_g.load_state_dict(torch.load(folder / "G2.pt", weights_only=True), strict=True)
    fresh_d.load_state_dict(torch.load(folder / "D2.pt", weights_only=True), strict=True)
    assert max_state_difference(torch_reference.state_dict_numpy(fresh_g), torch_reference.state_dict_numpy(net_g)) < 1e-10
    assert max_state_difference(torch_reference.state_dict_numpy(fresh_d), torch_reference.state_dict_numpy(net_d)) < 1e-10
    assert int(fresh_d.main[3].num_batches_tracked) == 3 * SPEC.steps and int(fresh_g.main[1].num_batches_tracked) == SPEC.steps


def test_state_dict_round_trip_is_exact(tmp_path):
    net_g, net_d = torch_reference.make_models(dataclasses.replace(SPEC, nz=10, ngf=4, ndf=4))
    for net in (net_g, net_d):
        original = torch_reference.state_dict_numpy(net)
        variables = state_dicts.state_dict_to_variables(original)
        back = state_dicts.variables_to_state_dict(variables["params"], variables["batch_stats"])
        assert list(back) == list(original)
        assert all(np.array_equal(back[k], original[k]) and back[k].dtype == original[k].dtype for k in original)
        state_dicts.save_state_dict_file(back, tmp_path / "w.safetensors")
        again = state_dicts.load_state_dict_file(tmp_path / "w.safetensors")
        assert all(np.array_equal(again[k], original[k]) for k in original)


class _Exploit:
    def __reduce__(self):
        return (print, ("this code must never run",))


def test_a_pickle_carrying_code_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    with path.open("wb") as f:
        pickle.dump({"main.0.weight": _Exploit()}, f)
    with pytest.raises(state_dicts.CheckpointFormatError, match="weights-only"):
        state_dicts.load_state_dict_file(path)
    assert "this code must never run" not in capsys.readouterr().out


def test_bad_replay_inputs_are_clear_errors(tutorial_files, capsys):
    folder = tutorial_files[0]
    np.savez(folder / "bad.npz", real=np.zeros((2, 4, 3, 16, 16)), noise=np.zeros((2, 4, SPEC.nz, 1, 1)))
    args = ["replay", "--generator", str(folder / "G.pt"), "--discriminator", str(folder / "D.pt"), "--out", str(folder / "R.npz")]
    assert main(args + ["--batches", str(folder / "bad.npz")]) == 2
    assert "the models expect (3, 32, 32)" in capsys.readouterr().err
    np.savez(folder / "nonoise.npz", real=np.zeros((2, 4, 3, 32, 32)))
    assert main(args + ["--batches", str(folder / "nonoise.npz")]) == 2
    assert "lacks noise" in capsys.readouterr().err
    (folder / "broken.pt").write_bytes(b"not a checkpoint")
    assert main(["replay", "--generator", str(folder / "broken.pt"), "--discriminator", str(folder / "D.pt"),
                 "--batches", str(folder / "B.npz"), "--out", str(folder / "R.npz")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert not (folder / "R.npz").exists()


def test_a_state_dict_that_does_not_fit_names_the_key_and_both_shapes(tutorial_files, capsys):
    folder = tutorial_files[0]
    args = ["replay", "--discriminator", str(folder / "D.pt"), "--batches", str(folder / "B.npz"), "--out", str(folder / "R.npz")]
    state_dict = torch.load(folder / "G.pt", weights_only=True)
    wrong = dict(state_dict, **{"main.1.weight": torch.zeros(5, dtype=torch.float64)})  # BatchNorm of 4·ngf = 32 channels
    torch.save(wrong, folder / "G_wrong_shape.pt")
    assert main(args + ["--generator", str(folder / "G_wrong_shape.pt")]) == 2
    error = capsys.readouterr().err
    assert "main.1.weight: the file has shape (5,), the model expects (32,)" in error, error
    missing = {k: v for k, v in state_dict.items() if k != "main.4.running_var"}
    torch.save(dict(missing, **{"main.99.weight": torch.zeros(2)}), folder / "G_keys.pt")
    assert main(args + ["--generator", str(folder / "G_keys.pt")]) == 2
    error = capsys.readouterr().err
    assert "missing key main.4.running_var (the model expects shape (16,))" in error, error
    assert "unexpected key main.99.weight (shape (2,))" in error, error
    assert not (folder / "R.npz").exists()


@pytest.mark.parametrize(
    "real_shape,noise_shape,poison,message",
    [
        ((4, 3, 32, 32), (2, 4, SPEC.nz, 1, 1), None, "'real' must be (steps, batch, nc, H, W), got shape (4, 3, 32, 32)"),
        ((2, 4, 3, 32, 32), (2, 4, SPEC.nz + 1, 1, 1), None, f"expected (2, 4, {SPEC.nz}, 1, 1)"),
        ((2, 4, 3, 32, 32), (2, 4, SPEC.nz, 1, 1), "real", "contains NaN or infinite values"),
    ],
)
def test_malformed_batch_files_are_clear_errors(tutorial_files, capsys, real_shape, noise_shape, poison, message):
    folder = tutorial_files[0]
    real, noise = np.zeros(real_shape), np.zeros(noise_shape)
    if poison:
        real[0, 0, 0, 0, 0] = np.nan
    np.savez(folder / "malformed.npz", real=real, noise=noise)
    assert main(["replay", "--generator", str(folder / "G.pt"), "--discriminator", str(folder / "D.pt"),
                 "--batches", str(folder / "malformed.npz"), "--out", str(folder / "R.npz")]) == 2
    assert message in capsys.readouterr().err
    assert not (folder / "R.npz").exists()
