"""A module of the frozen program `app.py`: a target that is not in its main script."""


def cube(x: int) -> int:
    return x * x * x
