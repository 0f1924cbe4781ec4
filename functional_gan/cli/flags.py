"""The command line's shared flags: one per TrainConfig field, from :data:`functional_gan.config.FLAGS`."""

from __future__ import annotations

import argparse
import inspect

from functional_gan.config import TUTORIAL, TrainConfig

OPTIMIZER_FIELDS = ("lr", "beta1", "beta2")
LOSS_FIELDS = (*OPTIMIZER_FIELDS, "loss", "n_critic", "gp_weight")
MODEL_FIELDS = ("data", "epochs", "steps", "batch_size", "image_size", "nc", "nz", "ngf", "ndf")
RUN_FIELDS = ("api", "seed", "devices", "log_every", "sample_every", "checkpoint_every")


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help shows its default; flags whose default is "not given" say what that means instead."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def command(subparsers, run):
    """Declare the command ``run`` runs (``run_sample`` runs ``sample``), its help and description taken from
    ``run``'s docstring (the first line, then the rest); returns its parser, whose flags the caller adds."""
    name = run.__name__.removeprefix("run_").replace("_", "-")
    first, _, rest = inspect.getdoc(run).partition("\n\n")
    summary = first.rstrip(".")
    p = subparsers.add_parser(name, help=summary[:1].lower() + summary[1:], description=" ".join(rest.split()) or None,
                              formatter_class=Formatter)
    p.set_defaults(handler=run)
    return p


def config_flags(p, fields, loss_dependent: bool = True) -> None:
    """One flag per TrainConfig field, from :data:`functional_gan.config.FLAGS` (help) and the field (type, default).

    A field whose default is decided later (by the loss's entry, or by the data for --nc) defaults to None, and its
    help lists the defaults; with ``loss_dependent=False`` (no --loss flag) the tutorial's own values are the defaults.
    """
    import typing

    from functional_gan.config import FLAGS
    from functional_gan.losses import LOSSES

    hints = typing.get_type_hints(TrainConfig)
    for name in fields:
        help_text, decided = FLAGS[name]
        kind = next(t for t in (int, float, str) if t in (hints[name], *typing.get_args(hints[name])))
        default = getattr(TUTORIAL, name)
        if name == "api":
            from functional_gan.config import APIS

            p.add_argument("--api", default=default, choices=APIS, help=help_text)
            continue
        if name == "loss":
            p.add_argument("--loss", default=default, choices=tuple(LOSSES),
                           help=f"{help_text}: " + "; ".join(f"'{e.name}': {e.summary}" for e in LOSSES.values())
                           + ". A loss may have its own defaults for the optimizer flags and --n-critic")
            continue
        if decided == "later" and (loss_dependent or name == "nc"):
            owners = [e for e in LOSSES.values() if name in e.own_settings]
            others = "; ".join(f"{e.name}: {e.defaults[name]:g}" for e in LOSSES.values() if name in e.defaults)
            if name != "nc":
                base = "" if owners else f"{default:g}"
                listed = "; ".join(x for x in (base, others) if x)
                help_text += f" (default: {listed})"
            default = None
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=help_text)


def loss_config(args, **settings) -> TrainConfig:
    """The config the --loss flags describe (and ``settings``), validated."""
    from functional_gan.losses import config_for_loss

    return config_for_loss(args.loss, **{name: getattr(args, name) for name in LOSS_FIELDS if name != "loss"},
                           **settings).validate()


def names_argument(p, dest: str, names, what: str, **kwargs) -> None:
    """A positional list of names, each one of ``names`` (argparse's own ``choices=`` refuses an empty list on
    Python 3.11); an unknown one is a usage error (exit status 2) that lists the known ones."""

    def known(value: str) -> str:
        if value not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {value}; choose from {', '.join(names)}")
        return value

    p.add_argument(dest, nargs="*", type=known, **kwargs)
