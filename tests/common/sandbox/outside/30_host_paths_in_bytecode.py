import builtins
import glob
found = {}
for path in glob.glob('/opt/python/lib/python3*/__pycache__/_sysconfigdata*.pyc')[:1] + glob.glob(
        '/opt/python/lib/python3*/__pycache__/os.*.pyc')[:1] + glob.glob(
        '/opt/site/PIL/__pycache__/Image.*.pyc')[:1] + glob.glob('/opt/site/numpy/__pycache__/__init__.*.pyc')[:1]:
    data = open(path, 'rb').read()
    hits = re.findall(rb'/(?:root|home|work|srv|opt|usr/local|app)/[\x21-\x7e]{3,60}', data)
    found[path.rsplit('/', 1)[1]] = builtins.sorted(builtins.set(h.decode() for h in hits))[:3]
print(found)
# the runtime's masks and blanks hide site-packages, config-* and _sysconfigdata*.py,
# but every compiled file bound in still names where it was compiled (co_filename), and
# __pycache__ keeps _sysconfigdata's bytecode: the host's Python prefix (a home folder),
# its build configuration and the project's own path (its virtual environment) show
