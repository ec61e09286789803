"""``python -m layerforge.pycaffe --python-path``: the directory to put on PYTHONPATH for ``import caffe``."""
import argparse
import os


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m layerforge.pycaffe",
                                     description="pycaffe-compatible interface of layerforge")
    parser.add_argument("--python-path", action="store_true",
                        help="print the directory that makes `import caffe` load layerforge.pycaffe")
    args = parser.parse_args(argv)
    if not args.python_path:
        parser.print_help()
        return 0
    print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
