"""Renderings of verdicts and runs: terminal (rich), JUnit XML, Markdown. None of them print."""
