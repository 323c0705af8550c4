"""A team's own small language model (``mypackage.model``), written without the stability package."""
