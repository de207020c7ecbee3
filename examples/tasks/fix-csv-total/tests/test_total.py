import os
import subprocess
import tempfile
import unittest

from total import total


class TotalTest(unittest.TestCase):
    def test_sales(self):
        out = subprocess.run(["python3", "/app/total.py", "/app/sales.csv"], capture_output=True, text=True)
        self.assertEqual(out.stdout.strip(), "42")

    def test_other_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("item,amount\nx,1\ny,2\n")
        try:
            self.assertEqual(total(f.name), 3)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
