"""Name -> class tables filled by explicit decorators (``@register_layer("ReLU")``, ``@register_solver("Adam")``)."""


def registrar(table, what):
    """A class decorator factory that stores classes in ``table`` under a name and sets ``cls.type``.

    ``what`` names the kind of thing in the error for a name registered twice (``"layer type"``).
    """

    def register(type_name):
        def decorate(cls):
            if type_name in table:
                raise ValueError(f"{what} {type_name!r} registered twice")
            cls.type = type_name
            table[type_name] = cls
            return cls

        return decorate

    return register
