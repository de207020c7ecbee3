import unittest

from wordcount import count_words


class CountWordsTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(count_words("a b c"), 3)

    def test_runs_of_spaces(self):
        self.assertEqual(count_words("  a   b  "), 2)

    def test_tabs_and_newlines(self):
        self.assertEqual(count_words("a\tb\nc"), 3)

    def test_blank(self):
        self.assertEqual(count_words("   "), 0)


if __name__ == "__main__":
    unittest.main()
