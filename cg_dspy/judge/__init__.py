"""The judge: CL-bench's rubrics checked against an answer, the paper's way (one requirement
per call, K votes, majority; `voting`) or CL-bench's official one-prompt way; its prompts
(`signatures`), its typed verdicts (`verdicts`), the optimizers' metric (`metric`) and the
requirement typer of Table 2 (`typer`).

Nothing is imported here: the trace writer process reads `verdicts` without loading DSPy.
"""
