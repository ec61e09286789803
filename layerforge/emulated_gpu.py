"""The product's one door to the emulated CUDA device (layerforge_emulator, docs/gpu.md).

``LAYERFORGE_EMULATED_GPU`` set (any value but empty or ``0``): ``import layerforge`` puts the emulator in place of
cupy, in this process and in every subprocess that inherits the variable. Nothing else in layerforge imports the
emulator; without the variable it is never loaded, and this module needs neither numpy nor cupy.
"""
import os
import sys

ENV = "LAYERFORGE_EMULATED_GPU"


def requested():
    """True when ``LAYERFORGE_EMULATED_GPU`` asks for the emulated device."""
    return os.environ.get(ENV, "") not in ("", "0")


def install_if_requested():
    """The emulated device in place of cupy when the variable asks for it; nothing otherwise."""
    if requested():
        from layerforge_emulator import install  # the product's only import of the emulator

        install.install()


def installed():
    """Whether the emulated device is cupy in this process (by the variable, or by a test's ``installed()``), read
    without importing it: workers started from here must get it too."""
    install = sys.modules.get("layerforge_emulator.install")
    return install is not None and install.is_installed()
