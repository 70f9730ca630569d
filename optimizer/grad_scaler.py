"""Dynamic loss scaling for fp16 training.

Why: fp16 has 5 exponent bits, so gradients below ~6e-8 underflow to zero. Multiplying the loss
by a large scale S moves the whole backward pass up into fp16's range; the optimizer divides
the (fp32) gradients by S again before using them (Micikevicius et al., "Mixed Precision
Training", 2018, sec. 3.2). Too large an S overflows to inf/NaN instead, so S adapts:
- a step whose gradients contain inf/NaN is skipped, and after `hysteresis` such steps the
  scale is multiplied by `backoff_factor` (never below `min_scale`);
- after `growth_interval` consecutive clean steps it is multiplied by `growth_factor`.
bf16 has fp32's exponent range and needs none of this.
The schedule is Megatron-LM's `DynamicGradScaler` (growth, backoff, hysteresis).
"""

from __future__ import annotations


class DynamicGradScaler:
    """Holds the loss scale S; `update(found_inf)` once per optimizer step moves it."""

    def __init__(self, initial_scale: float, min_scale: float = 1.0, growth_interval: int = 1000,
                 hysteresis: int = 2, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5) -> None:
        if not (initial_scale >= min_scale > 0):
            raise ValueError(f"need initial_scale >= min_scale > 0, got {initial_scale}, "
                             f"{min_scale}")
        if growth_factor <= 1 or not 0 < backoff_factor < 1:
            raise ValueError("need growth_factor > 1 and 0 < backoff_factor < 1")
        self.scale = float(initial_scale)
        self.min_scale = float(min_scale)
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.clean_steps = 0  # consecutive steps without inf/NaN
        self.hysteresis_left = hysteresis  # overflows still tolerated before backing off

    @property
    def inv_scale(self) -> float:
        return 1.0 / self.scale

    def update(self, found_inf: bool) -> None:
        """Adjust S after a step; every rank must pass the same `found_inf` (all-reduced)."""
        if found_inf:
            self.clean_steps = 0
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.clean_steps = 0
                self.hysteresis_left = self.hysteresis
                self.scale *= self.growth_factor

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "clean_steps": self.clean_steps,
                "hysteresis_left": self.hysteresis_left}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        expected = {"scale", "clean_steps", "hysteresis_left"}
        if set(state) != expected:
            raise KeyError(f"grad scaler state has keys {sorted(state)}, expected "
                           f"{sorted(expected)}")
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])
