# examples/quickstart.ipynb runs headless from top to bottom (nbclient): it trains ResNet-20 for a few
# hundred steps, plots, predicts and saves; any error in any cell fails the test.
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart.ipynb")


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"), reason="dataset-fashion-mnist is not installed")
def test_quickstart_notebook(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    out = tmp_path / "runs" / "quickstart"
    assert (out / "curves.png").stat().st_size > 10000
    assert (out / "quickstart.safetensors").exists()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "accuracy on 500 test images" in text
    figures = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if "image/png" in o.get("data", {}))
    assert figures == 2  # the curves and the predictions, rendered inline
