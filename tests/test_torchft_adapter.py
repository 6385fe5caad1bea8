"""training/torchft_adapter.py reaches a few names torchft does not publish (``UNPUBLISHED``): the
installed torchft has every one, and a release without one is named, with what it served, so the
pin in requirements-ft.txt can move once the adapter follows."""
import pytest

ft = pytest.importorskip("training.torchft_adapter", reason="torchft is not installed (requirements-ft.txt)")


def test_the_installed_torchft_has_every_name_the_adapter_reaches():
    from importlib.metadata import version
    missing = ft.missing_internals()
    assert not missing, (f"torchft {version('torchft')} lacks what training/torchft_adapter.py reaches: "
                         f"{missing}; adapt the adapter before moving the pin in requirements-ft.txt")


def test_a_name_torchft_lacks_is_named_with_what_it_served(monkeypatch):
    monkeypatch.setattr(ft, "UNPUBLISHED", (*ft.UNPUBLISHED, ("DiLoCo", "self._meeting_weights", "the weights"),
                                            ("ManagerClient", "_no_such_call", "a call"),
                                            ("Manager.__init__", "self._no_such_field", "a field"),
                                            ("NoSuchClass", "self.anything", "a class")))
    assert ft.missing_internals() == ["DiLoCo: self._meeting_weights (the weights)",
                                      "ManagerClient: _no_such_call (a call)",
                                      "Manager.__init__: self._no_such_field (a field)",
                                      "NoSuchClass: self.anything (a class)"]
