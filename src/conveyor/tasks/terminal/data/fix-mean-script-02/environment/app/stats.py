"""Print the mean of the numbers in a file (one per line), with two decimals."""
import sys


def mean(values):
    return sum(values) // len(values)


def main(path):
    values = [float(line) for line in open(path) if line.strip()]
    print(f"{mean(values):.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
