"""PyTorch checkpoints in and out of the command line, with files written by the tutorial's own classes.

``sample --generator netG.pth``, ``train --init-generator/--init-discriminator`` (continue a
PyTorch run in JAX) and ``export`` (state_dicts that ``load_state_dict(strict=True)`` accepts).
"""

import copy
import json

import jax
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from functional_gan import plots
from functional_gan.config import TrainConfig
from functional_gan.data import load_dataset
from functional_gan.main import main
from functional_gan.metrics import METRIC_NAMES
from functional_gan.pytorch import dcgan as torch_reference
from functional_gan.train import step_noise

# The tutorial's globals, at small widths (its classes read them), and its classes verbatim.
nz, ngf, ndf, nc = 16, 8, 8, 3


class Generator(nn.Module):
    def __init__(self, ngpu):
        super(Generator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super(Discriminator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input)


CONFIG = TrainConfig(data="fake", batch_size=8, image_size=64, nz=nz, ngf=ngf, ndf=ndf, nc=nc)
WIDTH_ARGS = ["--image-size", "64", "--nz", str(nz), "--ngf", str(ngf), "--ndf", str(ndf), "--nc", str(nc)]


@pytest.fixture(scope="module")
def tutorial_files(tmp_path_factory):
    """netG/netD after two iterations of the tutorial's loop, saved as the tutorial saves them."""
    folder = tmp_path_factory.mktemp("tutorial")
    torch.manual_seed(999)
    net_g, net_d = Generator(1), Discriminator(1)
    net_g.apply(torch_reference.weights_init)
    net_d.apply(torch_reference.weights_init)
    optimizer_g, optimizer_d = torch_reference.make_optimizers(net_g, net_d, CONFIG)
    for _ in range(2):  # running statistics and counters that are not the initial ones
        torch_reference.tutorial_iteration(net_g, net_d, optimizer_g, optimizer_d, nn.BCELoss(),
                                           torch.rand(8, nc, 64, 64) * 2 - 1, torch.randn(8, nz, 1, 1))
    torch.save(net_g.state_dict(), folder / "netG_epoch_1.pth")
    torch.save(net_d.state_dict(), folder / "netD_epoch_1.pth")
    return folder, net_g, net_d


def _grid_pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path), np.int16)


@pytest.mark.parametrize("eval_bn", [False, True])
def test_sample_from_the_tutorials_netG(tmp_path, tutorial_files, capsys, eval_bn):
    folder, net_g, _ = tutorial_files
    flags = ["--eval-bn"] if eval_bn else []
    assert main(["sample", "--generator", str(folder / "netG_epoch_1.pth"), "--out", str(tmp_path / "jax.png"),
                 "--num", "16", "--seed", "0", *flags]) == 0
    assert f"(nz {nz}, ngf {ngf}, nc {nc}, 64×64)" in capsys.readouterr().out
    # PyTorch's netG on the same noise (train mode as in the tutorial, or .eval()), drawn by the same grid code.
    noise = np.array(jax.random.normal(jax.random.key(0), (16, nz)))  # a writable copy for torch.from_numpy
    reference = copy.deepcopy(net_g).train(not eval_bn)
    with torch.no_grad():
        images = reference(torch.from_numpy(noise).view(16, nz, 1, 1)).numpy().transpose(0, 2, 3, 1)
    plots.save_grid(images, tmp_path / "torch.png")
    # float32 on both sides; a pixel may round to the neighbouring 8-bit level.
    assert np.max(np.abs(_grid_pixels(tmp_path / "jax.png") - _grid_pixels(tmp_path / "torch.png"))) <= 1


def test_continue_a_pytorch_run_in_jax_then_export_it_back(tmp_path, tutorial_files, capsys):
    folder, net_g, net_d = tutorial_files
    run = tmp_path / "run"
    assert main(["train", "--data", "fake", "--out", str(run), "--steps", "1", "--batch-size", "8", *WIDTH_ARGS,
                 "--init-generator", str(folder / "netG_epoch_1.pth"),
                 "--init-discriminator", str(folder / "netD_epoch_1.pth"), "--no-progress"]) == 0
    assert "Adam states start fresh" in capsys.readouterr().out

    # The same iteration in PyTorch: the same weights, a fresh Adam, the batch and noise JAX trained on.
    torch_g, torch_d = copy.deepcopy(net_g), copy.deepcopy(net_d)
    optimizer_g, optimizer_d = torch_reference.make_optimizers(torch_g, torch_d, CONFIG)
    real = load_dataset("fake", 64, nc).batch(CONFIG.seed, 0, 8).transpose(0, 3, 1, 2)
    noise = np.array(step_noise(CONFIG, 0, 8)).reshape(8, nz, 1, 1)  # a copy: torch.from_numpy warns on a read-only one
    expected = torch_reference.tutorial_iteration(torch_g, torch_d, optimizer_g, optimizer_d, nn.BCELoss(),
                                                  torch.from_numpy(real), torch.from_numpy(noise))
    logged = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    # One float32 step from the same state: rounding only (the teacher-forcing tolerance of the comparison suite).
    np.testing.assert_allclose([logged[k] for k in METRIC_NAMES], expected, rtol=1e-5)

    assert main(["export", "--checkpoint", str(run), "--generator", str(tmp_path / "G.pth"),
                 "--discriminator", str(tmp_path / "D.safetensors")]) == 0
    exported_g, exported_d = Generator(1), Discriminator(1)
    exported_g.load_state_dict(torch.load(tmp_path / "G.pth", weights_only=True), strict=True)
    from safetensors.torch import load_file

    exported_d.load_state_dict(load_file(str(tmp_path / "D.safetensors")), strict=True)
    for exported, reference in ((exported_g, torch_g), (exported_d, torch_d)):
        ours, theirs = exported.state_dict(), reference.state_dict()
        for key in theirs:
            if key.endswith("num_batches_tracked"):
                assert int(ours[key]) == int(theirs[key]), key  # 2 PyTorch iterations + 1 JAX: G 3, D 9
            else:
                # Parameters: Adam's first update can differ by 2·lr where a gradient is ~0 (a rounding sign flip).
                assert float((ours[key] - theirs[key]).abs().max()) <= 2 * CONFIG.lr, key
    assert int(exported_g.main[1].num_batches_tracked) == 3 and int(exported_d.main[3].num_batches_tracked) == 9


def test_init_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path, tutorial_files, capsys):
    folder = tutorial_files[0]
    run = tmp_path / "run"
    assert main(["train", "--data", "fake", "--out", str(run), "--steps", "1", "--batch-size", "8", "--image-size", "64",
                 "--nz", str(nz), "--ngf", str(2 * ngf), "--ndf", str(ndf), "--nc", str(nc),
                 "--init-generator", str(folder / "netG_epoch_1.pth")]) == 2
    error = capsys.readouterr().err
    assert f"main.0.weight: the file has shape ({nz}, {8 * ngf}, 4, 4), the model expects ({nz}, {16 * ngf}, 4, 4)" in error
    assert not run.exists()


def test_export_needs_a_file_to_write_and_a_good_checkpoint(tmp_path, capsys):
    assert main(["export", "--checkpoint", str(tmp_path)]) == 2
    assert "--generator and/or --discriminator" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "nope"), "--generator", str(tmp_path / "G.pth")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "G.pth").exists()
