"""``python -m layerforge.pycaffe --python-path``: the directory to put on PYTHONPATH for ``import caffe``;
``--install-hook`` / ``--remove-hook``: the same for every run of this interpreter, through a ``.pth`` file."""
import argparse
import os
import sysconfig

PTH_NAME = "layerforge-caffe.pth"


def python_path():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "python")


def hook_text():
    """The .pth lines: the stand-in's folder goes on sys.path (after everything else), and the finder is installed
    (a Caffe checkout's uncompiled python/ ahead on the path then gives layerforge.pycaffe too)."""
    return f"{python_path()}\nimport layerforge_caffe_finder; layerforge_caffe_finder.install()\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m layerforge.pycaffe",
                                     description="pycaffe-compatible interface of layerforge")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--python-path", action="store_true",
                      help="print the directory that makes `import caffe` load layerforge.pycaffe")
    what.add_argument("--install-hook", action="store_true",
                      help=f"write {PTH_NAME} into site-packages: `import caffe` loads layerforge.pycaffe in every "
                           "run of this Python (Jupyter kernels too), unless a built Caffe comes first on the path")
    what.add_argument("--remove-hook", action="store_true", help=f"remove the {PTH_NAME} that --install-hook wrote")
    parser.add_argument("--site-dir", default=sysconfig.get_paths()["purelib"],
                        help="the site-packages folder for --install-hook/--remove-hook (default: %(default)s)")
    args = parser.parse_args(argv)
    pth = os.path.join(args.site_dir, PTH_NAME)
    if args.python_path:
        print(python_path())
    elif args.install_hook:
        with open(pth, "w") as f:
            f.write(hook_text())
        print(f"wrote {pth}")
    elif args.remove_hook:
        if os.path.exists(pth):
            os.remove(pth)
            print(f"removed {pth}")
        else:
            print(f"{pth} is not there")
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
