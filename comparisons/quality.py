"""Long float32 runs compared statistically: sample quality of both frameworks on the built-in digits.

float32 trajectories of the two frameworks drift apart (rounding is amplified), so long runs are
compared by what they produce. For each seed both frameworks train from the same initial weights
(the tutorial's ``weights_init`` in PyTorch) on the same batches and noise; the spread across
seeds is the run-to-run noise. Quality is measured offline in the feature space of a small
classifier trained in JAX on the same digits:

* a Fréchet distance between real and generated feature distributions (FID's formula), and
* a classifier score ``exp(E[KL(p(y|x) ‖ p(y))])`` (the Inception score's formula, 1 to 10).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.linalg

from functional_gan.config import TUTORIAL, TrainConfig
from functional_gan.data import load_digits, to_unit_range
from functional_gan.train import make_models


class DigitClassifier(nn.Module):
    """A small MLP on 32×32 digits; ``features`` is its 64-d penultimate layer."""

    @nn.compact
    def __call__(self, images_NHWC, return_features: bool = False):
        x = images_NHWC.mean(axis=-1).reshape(images_NHWC.shape[0], -1)  # gray
        x = nn.relu(nn.Dense(256)(x))
        features = nn.relu(nn.Dense(64)(x))
        logits = nn.Dense(10)(features)
        return (logits, features) if return_features else logits


@dataclasses.dataclass
class Classifier:
    params: dict
    test_accuracy: float

    def features_and_probabilities(self, images_NHWC: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, features = DigitClassifier().apply(self.params, jnp.asarray(images_NHWC, jnp.float32), return_features=True)
        return np.asarray(features, np.float64), np.asarray(jax.nn.softmax(logits), np.float64)


def train_classifier(image_size: int = 32, steps: int = 600, seed: int = 0) -> Classifier:
    """Train on 80% of scikit-learn's digits (at the GAN's size, in [−1, 1]); accuracy on the other 20%."""
    from sklearn.datasets import load_digits as sklearn_digits

    images = to_unit_range(load_digits(image_size, nc=1).images_NHWC)
    labels = sklearn_digits().target
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train_idx, test_idx = order[:split], order[split:]
    model = DigitClassifier()
    params = model.init(jax.random.key(seed), jnp.zeros((1, image_size, image_size, 1)))
    optimizer = optax.adam(1e-3)

    @jax.jit
    def step(params, opt_state, x, y):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        batch = rng.choice(train_idx, 128)
        params, opt_state = step(params, opt_state, jnp.asarray(images[batch]), jnp.asarray(labels[batch]))
    predictions = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(images[test_idx])), -1))
    return Classifier(params, float(np.mean(predictions == labels[test_idx])))


def frechet_distance(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """‖μa − μb‖² + Tr(Σa + Σb − 2(ΣaΣb)^½), FID's formula."""
    mu_a, mu_b = features_a.mean(0), features_b.mean(0)
    cov_a, cov_b = np.cov(features_a, rowvar=False), np.cov(features_b, rowvar=False)
    eye = 1e-6 * np.eye(cov_a.shape[0])  # dead ReLU features make covariances singular
    root = scipy.linalg.sqrtm((cov_a + eye) @ (cov_b + eye))
    root = np.real(root)
    return float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a + cov_b - 2 * root))


def classifier_score(probabilities: np.ndarray) -> float:
    """exp(E_x[KL(p(y|x) ‖ p(y))]): 1 for useless samples, up to 10 for confident, diverse digits."""
    marginal = probabilities.mean(0, keepdims=True)
    kl = np.sum(probabilities * (np.log(probabilities + 1e-12) - np.log(marginal + 1e-12)), axis=1)
    return float(np.exp(kl.mean()))


# The long runs: the tutorial's settings on the built-in digits at 32×32, one channel, half widths.
QUALITY_RUN = dataclasses.replace(TUTORIAL, data="digits", image_size=32, nc=1, ngf=32, ndf=32, batch_size=64, steps=300)


@dataclasses.dataclass(frozen=True)
class QualitySpec:
    run: TrainConfig = QUALITY_RUN  # its seed is replaced by each of `seeds`
    seeds: tuple[int, ...] = tuple(range(1, 9))  # 8 paired seeds
    num_samples: int = 512


def digits_batches(spec: QualitySpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(real, noise) NCHW float32 for ``spec.steps`` iterations: shuffled digits, NumPy noise."""
    run = spec.run
    digits = to_unit_range(load_digits(run.image_size, nc=run.nc).images_NHWC).transpose(0, 3, 1, 2)
    rng = np.random.default_rng(seed)
    per_epoch = len(digits) // run.batch_size
    batches = []
    for step in range(run.steps):
        epoch, index = divmod(step, per_epoch)
        if index == 0:
            order = rng.permutation(len(digits))
        batches.append(digits[order[index * run.batch_size : (index + 1) * run.batch_size]])
    noise = rng.normal(size=(run.steps, run.batch_size, run.nz, 1, 1)).astype(np.float32)
    return np.stack(batches), noise


def sample_images(generator_sd: dict, spec: QualitySpec, num: int, seed: int = 123) -> np.ndarray:
    """Samples of a trained G (JAX forward, train-mode BatchNorm as the tutorial), NHWC in [−1, 1]."""
    from functional_gan import state_dicts

    variables = state_dicts.state_dict_to_variables(generator_sd)
    generator, _ = make_models(spec.run)
    z = jax.random.normal(jax.random.key(seed), (num, spec.run.nz))
    return np.asarray(generator.apply(variables, z, mutable=["batch_stats"])[0])


def paired_difference(jax_values, torch_values, confidence: float = 0.95, power: float = 0.8) -> dict:
    """The paired comparison of per-seed scores (each seed: same weights, data and noise in both frameworks).

    The difference JAX − PyTorch per seed; its mean with a Student-t confidence interval, the
    paired t-test's p-value, and the smallest true difference the test would detect with
    ``power`` at that confidence: (t_{1−α/2} + t_{power}) · sd/√n. Passes when the interval holds
    0: no systematic difference that these seeds can see (the detectable difference says how
    large one would have to be).
    """
    import scipy.stats

    j, t = np.asarray(jax_values, np.float64), np.asarray(torch_values, np.float64)
    if len(j) != len(t) or len(j) < 2:
        raise ValueError(f"a paired comparison needs ≥ 2 seeds in both frameworks, got {len(j)} and {len(t)}")
    d = j - t
    n = len(d)
    standard_error = float(d.std(ddof=1) / np.sqrt(n))
    t_critical = float(scipy.stats.t.ppf(0.5 + confidence / 2, n - 1))
    mean = float(d.mean())
    low, high = mean - t_critical * standard_error, mean + t_critical * standard_error
    p_value = float(scipy.stats.ttest_rel(j, t).pvalue) if standard_error > 0 else (1.0 if mean == 0 else 0.0)
    return {"jax_mean": float(j.mean()), "pytorch_mean": float(t.mean()), "mean_difference": mean,
            "interval": (low, high), "confidence": confidence, "p_value": p_value, "seeds": n,
            "detectable": (t_critical + float(scipy.stats.t.ppf(power, n - 1))) * standard_error, "power": power,
            "passed": bool(low <= 0.0 <= high)}


# The sample-quality rows are judged (pass/fail) from this many paired seeds on; with fewer they are estimates with
# their intervals. Measured with 8 seeds (jax 0.10.2, its workaround on and off; jax 0.12): no systematic gap, and a
# gap of 21–31 in Fréchet distance would be seen with 80% power (docs/limitations.md).
JUDGED_SEEDS = 8


def family_confidence(seeds: int, rows: int = 2) -> float:
    """Each quality row's confidence: Bonferroni over the ``rows`` judged together (5% false alarms for the pair),
    the usual 95% for an estimate that is only reported."""
    return 1 - 0.05 / rows if seeds >= JUDGED_SEEDS else 0.95


def compare_quality(spec: QualitySpec, progress=print, confidence: float = 0.95) -> dict:
    """Train both frameworks per seed and score their samples. Returns per-seed metrics and the verdict."""
    from functional_gan.replay import replay

    from .reference_runs import run_tutorial

    run = spec.run
    classifier = train_classifier(run.image_size)
    real_images = to_unit_range(load_digits(run.image_size, nc=1).images_NHWC)
    real_features, _ = classifier.features_and_probabilities(real_images)
    scores = {"jax": {"fd": [], "score": []}, "pytorch": {"fd": [], "score": []}}
    samples, curves = {}, {}
    untrained_fd = None
    for seed in spec.seeds:
        run_spec = dataclasses.replace(run, seed=seed)
        real, noise = digits_batches(spec, seed)
        torch_run = run_tutorial(run_spec, "float32", real=real, noise=noise)
        progress(f"  seed {seed}: PyTorch trained {run.steps} steps")
        jax_run = replay(torch_run.initial_generator, torch_run.initial_discriminator, real, noise, "float32", run_spec)
        progress(f"  seed {seed}: JAX trained {run.steps} steps")
        if untrained_fd is None:
            untrained = classifier.features_and_probabilities(sample_images(torch_run.initial_generator, spec, spec.num_samples))[0]
            untrained_fd = frechet_distance(real_features, untrained)
        for name, generator_sd in (("pytorch", torch_run.final_generator), ("jax", jax_run.generator_state_dict)):
            images = sample_images(generator_sd, spec, spec.num_samples)
            features, probabilities = classifier.features_and_probabilities(images)
            scores[name]["fd"].append(frechet_distance(real_features, features))
            scores[name]["score"].append(classifier_score(probabilities))
            samples.setdefault(name, images[:64])
        curves[seed] = {"pytorch": torch_run.metrics, "jax": jax_run.metrics}
    verdicts = ({metric: paired_difference(scores["jax"][metric], scores["pytorch"][metric], confidence)
                 for metric in ("fd", "score")}
                if len(spec.seeds) >= 2 else {})  # one seed: scores only, no statistics
    return {"scores": scores, "verdicts": verdicts, "untrained_fd": untrained_fd, "classifier_accuracy": classifier.test_accuracy,
            "samples": samples, "curves": curves, "real_samples": real_images[:64]}
