"""phaze's hydra configuration (config.yaml and its groups). The systems of the `system` group are
the hardware package's (phaze_hardware/systems/): they are registered here, where hydra reads this
package, so that a system is written once."""

from hydra.core.config_store import ConfigStore

from phaze_hardware import SYSTEMS

for _name, _system in SYSTEMS.items():
    ConfigStore.instance().store(group="system", name=_name, node=_system.record())
