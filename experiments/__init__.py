"""kvlab's commands (``python -m experiments.<name>``) and what they share."""

import sys

if sys.argv[:1] == ["-m"]:  # ``python -m experiments.<name>`` is starting
    from experiments.lib.signals import quiet_uncaught_interrupts

    quiet_uncaught_interrupts()
