"""DPA-GRPO on two ranks (issue #49, finding 5): with ``method.roles=shared`` a rank whose share left a role's set
empty still runs that set's passes, weight 0, so DDP's and FSDP2's collectives (and the micro-batch counts agreed
in each pass) line up; a skipped pass leaves the other rank waiting in a collective.

Two real gloo processes (:func:`tests.rollout.ranks.run_ranks`) build the module from the ``dpa_form`` config and
run its per-adapter backward (:meth:`~lit_credit.methods.DPAGRPOModule.loss_sets`, ``role_backward``) on role
batches made by hand: both ranks hold verifier pairs, only rank 0 approver pairs.
"""
from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from lit_credit.rollout import ChatCodec
from lit_credit.rollout.roles import action_batch, role_batch
from lit_credit.tasks.form_game import decision_action
from lit_credit.types import RoleActions
from tests.methods.test_dpa_module import SMALL
from tests.rollout.ranks import run_ranks


def pairs(role: str, decisions: tuple[str, str], prompt: list[int], codec: ChatCodec, group: int):
    acts = RoleActions(role, [prompt] * 2, [decision_action("15", d) for d in decisions], [group] * 2,
                       torch.tensor([1.0, 0.0]), paired=True)
    return role_batch(acts, codec), role


def backward_passes(rank: int, cfg) -> dict:
    """This rank's backward passes of one round's update, the sets it ran, and whether the generator adapter's
    passes changed its gradients."""
    module = instantiate(cfg.method, policy=instantiate(cfg.model))
    passes = []
    module.manual_backward = lambda loss: passes.append(1) or loss.backward()  # no trainer: plain backward
    codec = ChatCodec(module.tokenizer)
    prompt = codec.prompt_ids([{"role": "user", "content": "line 15: 37700"}])
    batches = {"verifier": pairs("verifier", ("SAC", "NS"), prompt, codec, 0)}
    if rank == 0:  # rank 1's share challenged nothing: no approver pairs there
        batches["approver"] = pairs("approver", ("KEEP", "REVISE"), prompt, codec, 1)
    proposals = action_batch([prompt] * 2, [codec.reply_ids("37700")] * 2, [0, 1], [1.0, 0.0], codec.pad_id)
    sets = module.loss_sets(batches, proposals)
    logs, moved = {}, {}
    for adapter in ("verifier", "generator"):
        module.use_adapter(adapter)
        before = [p.grad.clone() if p.grad is not None else None for p in module.adapter_params("generator")]
        module.role_backward(sets[adapter], torch.zeros(2, dtype=torch.long), logs)
        after = [p.grad for p in module.adapter_params("generator")]
        moved[adapter] = any(b is None or not torch.equal(a, b) for a, b in zip(after, before) if a is not None)
    finite = all(torch.isfinite(p.grad).all() for p in module.adapter_params("generator") if p.grad is not None)
    return {"passes": len(passes), "sets": {a: [(s[0], s[2]) for s in entries] for a, entries in sets.items()},
            "moved": moved, "finite": finite}


@pytest.mark.timeout(400)
def test_shared_roles_pad_a_set_only_another_rank_holds(make_cfg):
    cfg = make_cfg(*SMALL, "method.roles=shared", fast_task=False)
    instantiate(cfg.model).prepare()  # once, here: the ranks only load
    ranks = run_ranks(backward_passes, cfg, timeout=300)
    # Rank 1 runs the approver set as a weight-0 pass (role None): as many backward passes as rank 0.
    assert ranks[0]["passes"] == ranks[1]["passes"] > 0
    assert [r["sets"]["generator"] for r in ranks] == [[("approver", "approver"), ("proposals", "proposer")],
                                                       [("approver", None), ("proposals", "proposer")]]
    assert all(r["sets"]["verifier"] == [("verifier", "verifier")] for r in ranks)
    # The padding pass leaves rank 1's gradients as they were; rank 0's approver pairs move them.
    assert [r["moved"] for r in ranks] == [{"verifier": True, "generator": True}, {"verifier": True, "generator": False}]
    assert all(r["finite"] for r in ranks)
