"""One build step pyproject.toml cannot say: ship ``friendsock.pth`` into
site-packages, the start-up hook behind ``FRIENDSOCK_INSTALL=1`` (see
friendsock/_autoinstall.py). Everything else is in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "friendsock.pth"
# site.py runs a .pth line that starts with "import" at every start-up of
# this environment's Python: one environment look-up unless the variable
# is set (to anything but "" or "0").
PTH_LINE = (
    "import os; os.environ.get('FRIENDSOCK_INSTALL', '').strip() not in ('', '0') "
    "and __import__('friendsock._autoinstall')\n"
)


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            # An editable wheel holds the install directory's files, and
            # none of build_lib's (setuptools 64+, PEP 660).
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, PTH_NAME), "w", encoding="utf-8") as file:
            file.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


setup(cmdclass={"build_py": build_py_with_pth})
