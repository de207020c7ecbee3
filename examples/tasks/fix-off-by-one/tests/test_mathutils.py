import unittest

from mathutils import sum_range


class SumRangeTest(unittest.TestCase):
    def test_inclusive(self):
        self.assertEqual(sum_range(1, 4), 10)

    def test_single(self):
        self.assertEqual(sum_range(5, 5), 5)

    def test_empty(self):
        self.assertEqual(sum_range(3, 2), 0)

    def test_negative(self):
        self.assertEqual(sum_range(-2, 2), 0)


if __name__ == "__main__":
    unittest.main()
