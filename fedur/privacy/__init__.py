"""Client-level differential privacy (privacy.mode central | local): the mechanism's arithmetic
(mechanism.py), the accountant (accountant.py) and what a run releases (releases.py). docs/privacy.md."""

from fedur.privacy.releases import Federation, Privacy, build

__all__ = ["Federation", "Privacy", "build"]
