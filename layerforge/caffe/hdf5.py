"""Reading HDF5 files (Caffe's .caffemodel.h5 / .solverstate.h5, HDF5Data's files) only as far as they go.

An HDF5 external link points into another file, opened when the link is followed: a file that names one reads
data from wherever it points (or fails with h5py's ``KeyError: ... file signature not found`` deep inside a
worker). Caffe's writers never make one, so a link is refused in one line naming the file and the link.
"""
from ..errors import LayerforgeError


def stored(group, name, path, error=LayerforgeError):
    """``group[name]`` of the HDF5 file ``path``, or None when absent; an external link there raises ``error``
    (one line naming the file, the link and its target)."""
    import h5py

    link = group.get(name, getlink=True)
    if link is None:
        return None
    if isinstance(link, h5py.ExternalLink):
        where = f"{group.name.rstrip('/')}/{name}"
        raise error(f"{path}: '{where}' is an external link to {link.filename}:{link.path}; only data stored in "
                    f"the file itself is read (copy it in, e.g. with h5py's Group.copy)")
    return group[name]


def members(group, path, error=LayerforgeError):
    """``[(name, object)]`` of ``group``, each through :func:`stored`."""
    return [(name, stored(group, name, path, error)) for name in group]
