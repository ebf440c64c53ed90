"""swm's machinery is transparent to the model: live-tensor tracking (a dispatch mode) changes
nothing a recurrent cell computes under bf16 autocast, in eval (inference mode) or training, and
an error of swm's own modes is never reported as the user's code."""

import importlib.util
import sys

import pytest
import torch

from swmcli.errors import describe_unexpected, remember_user_file
from swmcli.memory.measure import LiveTensorBytes, MemoryMonitor
from swmcli.memory.trace import CategorisedLiveBytes
from swmcli.models.runner import make_runner

RECURRENT = {
    "GRUCell": lambda: torch.nn.GRUCell(6, 8),
    "LSTMCell": lambda: torch.nn.LSTMCell(6, 8),
    "GRU": lambda: torch.nn.GRU(6, 8, batch_first=True),
    "LSTM": lambda: torch.nn.LSTM(6, 8, batch_first=True),
}


class Recurrent(torch.nn.Module):
    """A linear embedding (bf16 under autocast) into a recurrent layer, rolled over 3 steps."""

    def __init__(self, kind: str):
        super().__init__()
        self.embed = torch.nn.Linear(4, 6)
        self.kind = kind
        self.cell = RECURRENT[kind]()

    def forward(self, x):  # x: (B, 3, 4)
        embedded = self.embed(x)
        if not self.kind.endswith("Cell"):
            out = self.cell(embedded)[0]
            return out[:, -1].float()
        state = None
        for t in range(embedded.shape[1]):
            state = self.cell(embedded[:, t], state)
            hidden = state[0] if isinstance(state, tuple) else state
        return hidden.float()


@pytest.mark.parametrize("kind", list(RECURRENT))
def test_recurrent_layers_plan_in_bf16_with_tracking_on(kind):
    """eval's warm-up: inference mode and bf16 autocast inside a tracked phase."""
    torch.manual_seed(0)
    model, x = Recurrent(kind), torch.randn(2, 3, 4)
    runner = make_runner(bf16=True, device="cpu")
    with runner.inference(model):
        untracked = model(x)
    monitor = MemoryMonitor(track_tensors=True)
    with monitor.phase("planning"), runner.inference(model):
        tracked = model(x)
    assert torch.equal(tracked, untracked)
    assert monitor.report.phases[0].live_tensor_peak_bytes > 0


@pytest.mark.parametrize("kind", ["GRUCell", "LSTM"])
@pytest.mark.parametrize("tracker", [LiveTensorBytes, CategorisedLiveBytes])
def test_recurrent_layers_train_in_bf16_with_tracking_on(kind, tracker):
    torch.manual_seed(0)
    model, x = Recurrent(kind), torch.randn(2, 3, 4)

    def gradients():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).square().mean()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    untracked = gradients()
    with tracker() as counted:
        tracked = gradients()
    assert all(torch.equal(a, b) for a, b in zip(tracked, untracked, strict=True))
    assert counted.peak > 0


def _user_module(tmp_path, source: str):
    path = tmp_path / "user_model.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("user_model_machinery", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    remember_user_file(str(path))
    sys.modules.pop("user_model_machinery", None)
    return module


USER_CODE = """
import torch

def forward(weight, x):
    return torch.nn.functional.linear(x, weight)
"""


def test_an_error_of_swms_tracking_is_not_blamed_on_the_user(tmp_path, monkeypatch):
    user = _user_module(tmp_path, USER_CODE)

    def broken(storage):
        raise RuntimeError("storage bookkeeping failed")

    with pytest.raises(Exception) as raised, LiveTensorBytes() as live:
        monkeypatch.setattr(live, "_track", broken)  # a fault in swm's own mode
        user.forward(torch.ones(2, 3), torch.ones(1, 3))
    message, hint = describe_unexpected(raised.value)
    assert "your code" not in message and "not in swm" not in hint
    assert "swm's live-tensor tracking" in message and "bug in swm" in hint


def test_the_users_own_error_under_tracking_is_still_theirs(tmp_path):
    user = _user_module(tmp_path, USER_CODE)
    with pytest.raises(RuntimeError) as raised, LiveTensorBytes():
        user.forward(torch.ones(2, 3), torch.ones(1, 3, dtype=torch.float64))
    message, hint = describe_unexpected(raised.value)
    assert message.startswith("your code raised RuntimeError") and "forward (" in message
    assert "not in swm" in hint
