"""The one base class of the errors a user causes and can fix (bad settings, data, files).

The command line prints these as one line and exits with status 2; anything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    """Input the program cannot use; the message says what is wrong and what to do."""
