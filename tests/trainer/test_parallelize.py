"""Every trainer option reaches the component field it names (one name per knob, or the one
rename table), no component field that a user should control is left at its default, and
each such option's default IS the component's default (a default exists once)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from optimizer import OptimizerConfig
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from trainer.options import TrainingOptions, default_value
from trainer.parallelize import OPTION_FOR_FIELD, from_options

# Values unlike every default, so a field that kept its default is caught.
CHANGED = {"lr": 0.123, "weight_decay": 0.0456, "adam_beta1": 0.81, "adam_beta2": 0.91,
           "adam_eps": 1e-7, "grad_clip": 0.37, "use_distributed_optimizer": True,
           "overlap_param_gather": True, "cpu_offload": True, "initial_loss_scale": 1024.0,
           "min_loss_scale": 2.0, "loss_scale_window": 77, "hysteresis": 3, "bucket_size": 1234,
           "overlap_grad_reduce": False, "grad_reduce_in_fp32": False, "powersgd_rank": 3,
           "powersgd_warmup_iters": 7, "seed": 99}
COMPONENTS = (OptimizerConfig, DistributedDataParallelConfig, PowerSGDState)
# Fields a component gets from somewhere else than an option of the same meaning.
NOT_OPTIONS = {"params_dtype", "overlap_step", "process_group", "seed", "allow_unused_params",
               "min_compression_rate", "use_error_feedback", "warm_start"}


def test_rename_table_names_real_options_and_fields():
    options = TrainingOptions().to_dict()
    component_args = set().union(*(inspect.signature(c).parameters for c in COMPONENTS))
    for field_name, option in OPTION_FOR_FIELD.items():
        assert option in options, option
        assert field_name in component_args, field_name


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.__name__)
def test_defaults_agree_with_the_component(component):
    """Fails when a trainer default and the default of the field it sets drift apart."""
    options = TrainingOptions().to_dict()
    checked = 0
    for name, parameter in inspect.signature(component).parameters.items():
        option = OPTION_FOR_FIELD.get(name, name)
        if name in NOT_OPTIONS or option not in options:
            continue
        assert default_value(option) == parameter.default, (option, component.__name__)
        checked += 1
    assert checked >= 2


def test_optimizer_config_gets_every_option():
    built = from_options(OptimizerConfig, CHANGED, params_dtype="bf16", overlap_step=False)
    computed = {"params_dtype", "overlap_step"}
    for field in dataclasses.fields(OptimizerConfig):
        if field.name in computed:
            continue
        option = OPTION_FOR_FIELD.get(field.name, field.name)
        assert getattr(built, field.name) == CHANGED[option], field.name
    assert built.params_dtype == "bf16"


def test_ddp_config_and_powersgd_state_get_their_options():
    ddp_config = from_options(DistributedDataParallelConfig, CHANGED)
    for name in ("bucket_size", "overlap_grad_reduce", "use_distributed_optimizer",
                 "grad_reduce_in_fp32"):
        assert getattr(ddp_config, name) == CHANGED[name], name
    state = from_options(PowerSGDState, CHANGED, process_group=None)
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter, state.seed) == (3, 7, 99)


def test_every_changed_value_is_an_option():
    assert set(CHANGED) <= set(TrainingOptions().to_dict())
