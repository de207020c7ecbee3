"""Small integer helpers."""


def sum_range(a, b):
    """Sum of the integers a..b, both ends included; 0 when a > b."""
    total = 0
    for i in range(a, b):
        total += i
    return total
