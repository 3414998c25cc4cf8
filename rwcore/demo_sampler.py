"""Deprecated: moved to `rwcore.sampling.demo` (`python -m rwcore.sampling.demo`)."""

import sys

if __name__ == "__main__":
    from rwcore._deprecated import warn_moved
    from rwcore.sampling.demo import main

    warn_moved("rwcore.demo_sampler", "rwcore.sampling.demo", stacklevel=2)
    sys.exit(main())
else:
    from rwcore._deprecated import alias_module

    alias_module(__name__)
