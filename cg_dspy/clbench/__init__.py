"""CL-bench: its tasks (`data`), our typed result and graded rows (`rows`), crash-safe
locked output files (`store`), the worker pool that fills them (`runner`), and the two
jobs on a file: generate answers (`generation`) and grade them with the judge (`grading`).
"""
