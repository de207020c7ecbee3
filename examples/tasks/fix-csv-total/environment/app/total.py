"""Print the sum of the `amount` column of a CSV file."""
import sys


def total(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return sum(int(line.split(",")[1]) for line in lines)


if __name__ == "__main__":
    print(total(sys.argv[1]))
