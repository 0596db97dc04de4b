"""Deprecated: the TOML writer moved to ``schedtrain.spec`` (``schedtrain.spec.write``).

``from schedtrain.spec import dump_spec, schedule_to_toml`` works the same; this alias
warns and will be removed in 0.3.
"""

import warnings

from schedtrain.spec.write import dump_spec, schedule_to_toml, toml_value, trigger_to_toml

__all__ = ["dump_spec", "schedule_to_toml", "toml_value", "trigger_to_toml"]

warnings.warn("schedtrain.toml_writer is deprecated; import dump_spec and schedule_to_toml "
              "from schedtrain.spec", DeprecationWarning, stacklevel=2)
