"""The loss settings are declared once, in `rwcore.kernels.loss_settings.LossSettings`: the kernels' functional
defaults, the nn.Module wrappers, `rw train`'s loss section (`rw config --describe`, YAML, overrides, ranges) and
the TRL, OpenRLHF and verl drop-ins follow from it."""

import dataclasses
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

from rwcore.integrations.openrlhf import RwcorePolicyLoss
from rwcore.integrations.verl import loss_params_from_config
from rwcore.kernels import (
    FilteredDualClipLoss,
    FusedLinearPolicyLoss,
    filtered_dual_clip_loss,
    fused_linear_policy_loss,
)
from rwcore.kernels.loss_settings import LossSettings, resolve_loss_settings
from rwcore.trainer.config import LossConfig, describe_config, load_config, loss_settings


def test_a_setting_added_to_loss_settings_reaches_describe_yaml_overrides_and_every_drop_in(tmp_path):
    # A new field on LossSettings -- nothing else is edited -- then the consumers are used (and the config and the
    # integrations imported) afresh. Every LossSettings built is recorded: the last one of a call is the kernel's.
    script = textwrap.dedent(f"""
        import dataclasses, types
        import torch
        import rwcore.kernels, rwcore.kernels.loss_settings as ls
        from rwcore.settings import setting

        built = []

        def record(self):
            ls.LossSettings.__base__.__post_init__(self)
            built.append(self)

        extra = ("tail_cap", float, setting(0.25, "A new loss knob, only declared on LossSettings.",
                                            "loss.tail_cap", ge=0, le=1))
        New = dataclasses.make_dataclass("LossSettings", [extra], bases=(ls.LossSettings,), frozen=True,
                                         namespace={{"__post_init__": record}})
        New.__module__ = ls.__name__
        ls.LossSettings = rwcore.kernels.LossSettings = New

        def refused(call, name):
            try:
                call()
            except ValueError as error:
                assert name in str(error), error
            else:
                raise AssertionError(f"{{name}} out of its declared range was accepted")

        # rw train's config: rw config --describe, a YAML file, an override, its range
        from rwcore.trainer.config import describe_config, dump_config, load_config, loss_settings

        text = describe_config()
        assert "loss.tail_cap = 0.25  (float)  A new loss knob, only declared on LossSettings." in text, text
        path = {str(tmp_path / "run.yaml")!r}
        open(path, "w").write("loss:\\n  tail_cap: 0.5\\n")
        cfg = load_config(path)
        assert cfg.loss.tail_cap == 0.5 and "tail_cap: 0.5" in dump_config(cfg)
        assert loss_settings(load_config(path, ["loss.tail_cap=0.75"])).tail_cap == 0.75
        refused(lambda: load_config(None, ["loss.tail_cap=2"]), "'loss.tail_cap'")

        # the kernel functional and modules: the declared default, a value, the declared range
        from rwcore.kernels import (
            FilteredDualClipLoss, FusedLinearPolicyLoss, filtered_dual_clip_loss, fused_linear_policy_loss)

        g = torch.Generator().manual_seed(0)
        old = -torch.rand(2, 3, generator=g) - 1
        new = (old + 0.1 * torch.randn(2, 3, generator=g)).requires_grad_(True)
        adv, mask = torch.randn(2, 3, generator=g), torch.ones(2, 3, dtype=torch.bool)
        filtered_dual_clip_loss(new, old, adv, mask, backend="torch")
        assert built[-1].tail_cap == 0.25
        filtered_dual_clip_loss(new, old, adv, mask, backend="torch", tail_cap=0.5)
        assert built[-1].tail_cap == 0.5
        refused(lambda: filtered_dual_clip_loss(new, old, adv, mask, tail_cap=2.0), "tail_cap")
        hidden, weight = torch.randn(4, 8, generator=g), torch.randn(16, 8, generator=g)
        labels, flat = torch.randint(0, 16, (4,), generator=g), torch.ones(4, dtype=torch.bool)
        fused_linear_policy_loss(hidden, weight, labels, -torch.rand(4) - 1, torch.randn(4), flat,
                                 backend="torch", tail_cap=0.5)
        assert built[-1].tail_cap == 0.5
        refused(lambda: fused_linear_policy_loss(hidden, weight, labels, -torch.rand(4), torch.randn(4), flat,
                                                 tail_cap=-1.0), "tail_cap")
        module = FilteredDualClipLoss(backend="torch", tail_cap=0.5)
        assert FilteredDualClipLoss().tail_cap == 0.25 and module.tail_cap == 0.5
        module(new, old, adv, mask)
        assert built[-1].tail_cap == 0.5
        refused(lambda: FilteredDualClipLoss(tail_cap=2.0), "tail_cap")
        fused = FusedLinearPolicyLoss(backend="torch", tail_cap=0.5)
        assert FusedLinearPolicyLoss().tail_cap == 0.25 and fused.tail_cap == 0.5
        fused(hidden, weight, labels, -torch.rand(4) - 1, torch.randn(4), flat)
        assert built[-1].tail_cap == 0.5
        refused(lambda: FusedLinearPolicyLoss(tail_cap=2.0), "tail_cap")

        # OpenRLHF: the attribute at the declared default, arise() takes it, forward passes it to the kernel
        from rwcore.integrations.openrlhf import RwcorePolicyLoss

        assert RwcorePolicyLoss().tail_cap == 0.25
        openrlhf = RwcorePolicyLoss.arise(tail_cap=0.5, backend="torch")
        assert openrlhf.tail_cap == 0.5
        openrlhf(new, old, adv, action_mask=mask)
        assert built[-1].tail_cap == 0.5
        refused(lambda: RwcorePolicyLoss.arise(tail_cap=2.0), "tail_cap")

        # verl: read from the actor config's policy_loss section, passed to the kernel
        from rwcore.integrations.verl import compute_policy_loss_rwcore, loss_params_from_config

        actor = {{"clip_ratio_low": 0.5, "clip_ratio_high": 4.0, "policy_loss": {{"tail_cap": 0.5}}}}
        assert loss_params_from_config({{}}).tail_cap == 0.25
        assert loss_params_from_config(actor).tail_cap == 0.5
        compute_policy_loss_rwcore(old, new, adv, mask, "token-mean", actor)
        assert built[-1].tail_cap == 0.5
        refused(lambda: loss_params_from_config({{"policy_loss": {{"tail_cap": 2.0}}}}), "tail_cap")

        # TRL: the mixin takes it as a keyword (not passed on to GRPOTrainer) and its loss passes it to the kernel
        from collections import defaultdict
        from rwcore.integrations.trl.trainer import RWGRPOMixin

        class GRPOTrainerStandIn:
            def __init__(self, *args, **kwargs):
                self.given = kwargs
                self.importance_sampling_level, self.top_entropy_quantile = "token", 1.0
                self.off_policy_mask_threshold, self.loss_type, self.beta = None, "dapo", 0.0
                self.model = types.SimpleNamespace(training=True)
                self.accelerator = types.SimpleNamespace(reduce=lambda values, reduction: values)
                self._metrics = {{"train": defaultdict(list)}}

        class Trainer(RWGRPOMixin, GRPOTrainerStandIn):
            def _rw_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, inputs):
                return new, torch.zeros_like(new), None

            def _rw_denominator(self, inputs, mode):
                return mask.sum()

        assert Trainer(rw_loss=False).rw_loss_settings.tail_cap == 0.25
        trainer = Trainer(tail_cap=0.5, loss_backend="torch", other=1)
        assert trainer.rw_loss_settings.tail_cap == 0.5 and trainer.given == {{"other": 1}}
        inputs = {{"prompt_ids": torch.zeros(2, 1, dtype=torch.long), "prompt_mask": torch.ones(2, 1),
                   "completion_ids": torch.zeros(2, 3, dtype=torch.long), "completion_mask": mask,
                   "advantages": adv[:, 0], "old_per_token_logps": old}}
        trainer._compute_loss(None, inputs)
        assert built[-1].tail_cap == 0.5
        refused(lambda: Trainer(tail_cap=2.0), "tail_cap")
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def _signature_defaults(fn, names):
    parameters = inspect.signature(fn).parameters
    return {name: parameters[name].default for name in names}


def test_every_entry_point_takes_its_defaults_from_the_declaration():
    declared = dataclasses.asdict(LossSettings())
    names = list(declared)
    assert _signature_defaults(filtered_dual_clip_loss, names) == declared
    assert _signature_defaults(fused_linear_policy_loss, names) == declared
    assert _signature_defaults(FilteredDualClipLoss, names) == declared
    assert _signature_defaults(FusedLinearPolicyLoss, names) == declared
    assert {name: getattr(FilteredDualClipLoss(), name) for name in names} == declared
    assert {name: getattr(FusedLinearPolicyLoss(), name) for name in names} == declared
    assert {name: getattr(LossConfig(), name) for name in names} == declared
    assert dataclasses.asdict(loss_settings(load_config(None))) == declared
    default = RwcorePolicyLoss()
    assert {name: getattr(default, name) for name in names} == pytest.approx(declared)
    assert {name: getattr(RwcorePolicyLoss.arise(), name) for name in names} == declared
    # verl's mapping of Arise's filter: clip_ratio_low = 1 - ratio_low, clip_ratio_high = ratio_high - 1
    arise = {"clip_ratio_low": 1 - declared["ratio_low"], "clip_ratio_high": declared["ratio_high"] - 1}
    assert dataclasses.asdict(loss_params_from_config(arise)) == pytest.approx(declared)
    for f in dataclasses.fields(LossSettings):
        assert f.metadata["config"] == f"loss.{f.name}" and f.metadata["help"] in describe_config()


@pytest.mark.parametrize(
    "values, names",
    [
        ({"ratio_low": -0.1}, ("ratio_low",)),
        ({"ratio_low": 2.0, "ratio_high": 2.0}, ("ratio_low", "ratio_high")),
        ({"ratio_high": float("inf")}, ("ratio_high",)),
        ({"clip_c": 1.0}, ("clip_c",)),
        ({"clip_c": "three"}, ("clip_c",)),
    ],
)
def test_a_value_outside_the_declaration_is_refused_naming_it_everywhere(values, names):
    for build in (
        lambda: resolve_loss_settings(**values),
        lambda: FilteredDualClipLoss(**values),
        lambda: FusedLinearPolicyLoss(**values),
        lambda: RwcorePolicyLoss.arise(**values),
    ):
        with pytest.raises(ValueError) as info:
            build()
        assert all(name in str(info.value) for name in names), info.value
    key = f"loss.{names[-1]}"
    overrides = [f"loss.{name}={value}" for name, value in values.items()]
    with pytest.raises(ValueError, match=key):
        load_config(None, overrides)


def test_the_kernels_read_number_like_values_and_refuse_unknown_settings():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 4, generator=g) - 1
    new = old + 0.3 * torch.randn(2, 4, generator=g)
    adv, mask = torch.randn(2, 4, generator=g), torch.ones(2, 4, dtype=torch.bool)
    plain, _ = filtered_dual_clip_loss(new, old, adv, mask, 0.5, 5.0, 3.0, backend="torch")
    as_tensors, _ = filtered_dual_clip_loss(
        new, old, adv, mask, torch.tensor(0.5), torch.tensor(5.0), torch.tensor(3.0), backend="torch"
    )
    assert torch.equal(plain, as_tensors)
    with pytest.raises(TypeError, match="tail_cap"):
        filtered_dual_clip_loss(new, old, adv, mask, tail_cap=0.5)
    with pytest.raises(TypeError, match="tail_cap"):
        FilteredDualClipLoss(tail_cap=0.5)
