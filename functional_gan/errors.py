"""The one base class of the errors a user causes and can fix (bad settings, data, files).

The command line prints these as one line and exits with status 2; anything else is a bug and
keeps its traceback.
"""


EXIT_USER_ERROR = 2  # the exit status of a command stopped by a UserError (or a path it cannot read or write)


class UserError(Exception):
    """Input the program cannot use; the message says what is wrong and what to do."""


def torch_side(module: str, what: str):
    """Import ``module`` of the PyTorch side, or raise :class:`UserError` saying that ``what`` needs the torch extra."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec("torch") is None:
            raise ImportError("No module named 'torch'")
        return importlib.import_module(module)
    except ImportError as error:
        raise UserError(f"{what} needs PyTorch: pip install 'functional-gan[torch]' ({error})") from error
