"""Run notebooks/credit_analysis.ipynb in a kernel, as a user opens it, on the records a test wrote."""
from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "..", "notebooks", "credit_analysis.ipynb")


def run_notebook(env: dict[str, str]) -> list:
    """Execute the stored notebook with ``env`` set (``LIT_CREDIT_SWEEP``, ``LIT_CREDIT_BY``, ...); every code
    cell's outputs, in order."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
