"""Drop-in integrations of rwcore's loss, sampler and rubric rewards into other trainers.

Each integration is its own submodule (e.g. `rwcore.integrations.trl`) and imports its trainer
lazily, on first use of the pieces that need it: importing `rwcore` or this package never imports
TRL, verl, OpenRLHF or verifiers, and the core never depends on them. `rwcore.integrations.verifiers`
puts the method inside a verifiers environment (the environments prime-rl trains on).
"""
