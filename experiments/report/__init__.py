"""The reproduction report: the paper's numbers (``paper``), kvlab's tables and figures
and the markdown report (``markdown``), and the static text on known gaps (``gaps.md``)."""
