"""Hostile programs, as a model steered by a prompt could write them, by class of attack.

Each goes through Thyme's own entry point (blacklist, rewrite, the harness, the host's
collection), so none uses what the blacklist refuses (``sys.``, ``socket.``,
``subprocess.``, ``exec(``, ...), and none starts with a block (the rewrite indents a
first line like its second). ``said`` lists words of which the step's observation (or,
for code that ends normally, what it printed) must hold one: that is the clear
observation each must end with.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hostile:
    name: str
    kind: str  # the class of attack
    code: str
    said: tuple[str, ...]


LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
RESULT_FD = 3  # the harness's result channel: the first descriptor it opens (os.dup(1))
OUT = "/mnt/data/temp_processed_images"
# a memory bomb ends at the memory limit (the OOM killer, or an allocation refused); on a
# busy machine the kernel's reclaim at the group's limit (charged to the group, and the
# code's own pages among what it evicts) may stall it into its CPU limit or the wall
# clock first: contained() checks its peak either way, which a missing limit fails
MEMORY_HELD = (
    "over the memory limit",
    "MemoryError",
    "Cannot allocate",
    "over the CPU time limit",
    "s (wall clock)",
)


def _forge(header: str) -> str:
    """Code that writes its own report on the result channel, then ends at once."""
    return f"import os\nos.write({RESULT_FD}, ({header}).encode() + b'\\n')\nos._exit(0)"


# a PNG whose header declares 100,000 x 100,000 pixels, in 60 bytes
PNG_BOMB = (
    "import struct, zlib\n"
    "data = b'\\x89PNG\\r\\n\\x1a\\n'\n"
    "chunks = [(b'IHDR', struct.pack('>IIBBBBB', 100000, 100000, 8, 2, 0, 0, 0)), "
    "(b'IDAT', zlib.compress(b'')), (b'IEND', b'')]\n"
    "for kind, body in chunks:\n"
    "    data += struct.pack('>I', len(body)) + kind + body\n"
    "    data += struct.pack('>I', zlib.crc32(kind + body))\n"
    f"processed_path = '{OUT}/bomb.png'\n"
    "open(processed_path, 'wb').write(data)\n"
    "print(processed_path)"
)
# machine code: mov eax, 20 (getpid in the 32-bit ABI); int 0x80; ret
INT80 = (
    LIBC + "import mmap\n"
    "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "page.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n"
    "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
    "print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())"
)

PROGRAMS = (
    # -- PID 1 and other processes' memory --------------------------------------------
    Hostile(
        "write PID 1's memory",
        "pid1",
        "f = open('/proc/1/mem', 'r+b')\nf.write(b'x')",
        ("No such file",),
    ),
    Hostile(
        "ptrace PID 1 and the parent",
        "pid1",
        LIBC + "print(libc.ptrace(16, 1, 0, 0), libc.ptrace(16, os.getppid(), 0, 0), "
        "os.getpid(), os.getppid())",
        ("-1 -1 2 1",),  # (PID 1 is the init, which runs none of the code)
    ),
    Hostile(
        "process_vm_writev into PID 1",
        "pid1",
        LIBC + "print(libc.syscall(311, 1, 0, 1, 0, 1, 0), ctypes.get_errno())",
        ("-1 1",),
    ),
    Hostile(
        "kill every process it can see",
        "pid1",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('still here')",
        ("not permitted",),  # (signals to itself only)
    ),
    Hostile(
        "outlive the kill: clear the parent-death signal",
        "pid1",
        LIBC + "print(libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno())",
        ("-1 1",),
    ),
    # -- setuid and world-writable files -----------------------------------------------
    Hostile(
        "a setuid file",
        "setuid",
        "open('/mnt/data/evil', 'wb').write(b'\\x7fELF')\nos.chmod('/mnt/data/evil', 0o6755)",
        ("Operation not permitted",),
    ),
    Hostile(
        "a file created setuid",
        "setuid",
        "fd = os.open('/mnt/data/evil', os.O_CREAT | os.O_WRONLY, 0o4755)",
        ("Operation not permitted",),
    ),
    # -- memory outside the address space: tmpfs, memfd, /dev/shm -----------------------
    Hostile(
        "fill /tmp",
        "memory",
        "block = b'x' * (8 << 20)\nf = open('/tmp/fill', 'wb')\n"
        "for _ in range(1000):\n    f.write(block)\n    f.flush()",
        ("No space left",),
    ),
    Hostile(
        "memfd", "memory", "import os\nfd = os.memfd_create('x')", ("Operation not permitted",)
    ),
    Hostile(
        "/dev/shm", "memory", "open('/dev/shm/x', 'wb').write(b'x' * (1 << 30))", ("No such file",)
    ),
    Hostile(
        "touch 3 GiB of memory",
        "memory",
        "blocks = []\nfor _ in range(48):\n    blocks.append(b'x' * (64 << 20))",
        MEMORY_HELD,
    ),
    Hostile(
        "shared anonymous memory",
        "memory",
        "import mmap\nm = mmap.mmap(-1, 1 << 30)\nfor i in range(0, 1 << 30, 4096):\n    m[i] = 1",
        MEMORY_HELD,
    ),
    # -- thread and process bombs --------------------------------------------------------
    Hostile(
        "1,000 threads",
        "tasks",
        "import threading, time\nfor _ in range(1000):\n"
        "    threading.Thread(target=time.sleep, args=(60,)).start()",
        ("can't start new thread",),
    ),
    Hostile(
        "a fork bomb",
        "tasks",
        "import os\nwhile True:\n    os.fork()",
        ("Operation not permitted",),
    ),
    Hostile(
        "clone without a thread",
        "tasks",
        LIBC + "print(libc.syscall(56, 17, 0, 0, 0, 0), ctypes.get_errno())",
        ("-1 1",),
    ),
    Hostile(
        "a user namespace of its own",
        "tasks",
        LIBC + "print(libc.unshare(0x10000000), libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))",
        ("-1 -1",),
    ),
    Hostile(
        "a shell",
        "tasks",
        "import os\nprint(os.system('id'), os.popen('id').read())",
        ("Operation not permitted", "-1", "32512"),
    ),
    # -- io_uring and raw system calls ------------------------------------------------------
    Hostile(
        "io_uring",
        "syscalls",
        LIBC + "params = ctypes.create_string_buffer(120)\n"
        "print(libc.syscall(425, 8, params), ctypes.get_errno())",
        ("-1 1",),
    ),
    Hostile("the 32-bit system call ABI", "syscalls", INT80, ("SIGSYS",)),
    Hostile(
        "an x32 system call",
        "syscalls",
        LIBC + "print(libc.syscall(0x40000000 | 39), ctypes.get_errno())",
        ("-1 1",),
    ),
    Hostile(
        "a socket by number",
        "syscalls",
        LIBC + "print(libc.syscall(41, 2, 1, 0), libc.syscall(53, 1, 1, 0, 0))",
        ("-1 -1",),
    ),
    Hostile(
        "kernel interfaces",
        "syscalls",
        LIBC + "calls = [(321, 0), (298, 0), (323, 0), (250, 0), (135, 0), (308, 0), "
        "(165, 0), (161, 0), (105, 0), (426, 0), (447, 0)]\n"
        "results = []\nfor number, argument in calls:\n"
        "    results.append(libc.syscall(number, argument, 0, 0, 0, 0))\n"
        "print(min(results), max(results))",
        ("-1 -1",),
    ),
    Hostile(
        "a limit raised again",
        "syscalls",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10 ** 6, 10 ** 6))",
        ("not permitted", "not allowed"),
    ),
    # -- disk and inode floods --------------------------------------------------------------
    Hostile(
        "2.5 GiB of files",
        "disk",
        "block = b'x' * (32 << 20)\nfor i in range(80):\n"
        "    open(f'/mnt/data/big{i}', 'wb').write(block)",
        ("No space left",),
    ),
    Hostile(
        "150,000 files",
        "disk",
        "made = 0\nfor i in range(150000):\n    open(f'/mnt/data/f{i}', 'w').close()",
        ("No space left",),
    ),
    Hostile(
        "a folder chain 3,000 deep",
        "disk",
        "import os\nos.chdir('/mnt/data')\nfor _ in range(3000):\n"
        "    os.mkdir('d')\n    os.chdir('d')",
        ("No space left",),
    ),
    Hostile(
        "a sparse file of 18 GB",
        "disk",
        "f = open('/mnt/data/sparse.png', 'wb')\nf.truncate(18 << 30)",
        ("File too large",),
    ),
    # -- links, FIFOs and outputs the host would have read -------------------------------
    Hostile(
        "a hard link named as an output",
        "outputs",
        f"from PIL import Image\nImage.new('RGB', (8, 8)).save('{OUT}/a.png')\n"
        f"os.link('{OUT}/a.png', '{OUT}/b.png')",
        ("Operation not permitted",),
    ),
    Hostile(
        "a symlink out of its folder",
        "outputs",
        f"os.symlink('/etc/passwd', '{OUT}/leak.png')",
        ("Operation not permitted",),
    ),
    Hostile(
        "a FIFO named .png", "outputs", f"os.mkfifo('{OUT}/wait.png')", ("Operation not permitted",)
    ),
    Hostile(
        "100 copies of one output",
        "outputs",
        "import shutil\nfrom PIL import Image\n"
        f"Image.new('RGB', (64, 64)).save('{OUT}/a.png')\n"
        f"for i in range(100):\n    shutil.copyfile('{OUT}/a.png', f'{OUT}/c{{i}}.png')\n"
        f"print(' '.join(f'{OUT}/c{{i}}.png' for i in range(100)))",
        ("96 more image(s) not shown",),
    ),
    Hostile("a 100,000 x 100,000 PNG", "outputs", PNG_BOMB, ("is over the",)),
    Hostile(
        "a sparse output",
        "outputs",
        f"processed_path = '{OUT}/s.png'\nf = open(processed_path, 'wb')\n"
        "f.truncate(60 << 20)\nf.close()",
        ("neither PNG nor JPEG",),
    ),
    # -- decoders other than PNG and JPEG ------------------------------------------------------
    Hostile(
        "an EPS file named .png",
        "decoders",
        f"processed_path = '{OUT}/x.png'\n"
        "open(processed_path, 'w').write("
        "'%!PS-Adobe-3.0 EPSF-3.0\\n%%BoundingBox: 0 0 9 9\\n')",
        ("neither PNG nor JPEG",),
    ),
    Hostile(
        "BMP, GIF, TIFF and WebP outputs",
        "decoders",
        "from PIL import Image\nimage = Image.new('RGB', (16, 16))\n"
        f"paths = ['{OUT}/a.bmp', '{OUT}/b.gif', '{OUT}/c.tiff', '{OUT}/d.webp']\n"
        "for path in paths:\n    image.save(path)\nprint(' '.join(paths))",
        ("neither PNG nor JPEG",),
    ),
    Hostile(
        "a truncated PNG",
        "decoders",
        "import io\nfrom PIL import Image\nbuffer = io.BytesIO()\n"
        "Image.new('RGB', (300, 300), 'red').save(buffer, 'PNG')\n"
        f"processed_path = '{OUT}/t.png'\n"
        "open(processed_path, 'wb').write(buffer.getvalue()[:200])",
        ("truncated", "broken", "image file"),
    ),
    # -- forged reports on the result channel ------------------------------------------------
    Hostile(
        "a report naming 20,000 images",
        "forged",
        _forge(
            "json.dumps({'images': [{'width': 1, 'height': 1}] * 20000, 'text': None, "
            "'printed': '', 'notes': []})"
        ),
        ("at most", "no report line"),
    ),
    Hostile(
        "a report nested 100,000 deep",
        "forged",
        _forge("'[' * 100000 + ']' * 100000"),
        ("not valid JSON",),
    ),
    Hostile(
        "50 MB on the result channel",
        "forged",
        f"import os\nfor _ in range(50):\n    os.write({RESULT_FD}, b'x' * (1 << 20))",
        ("wrote more than",),
    ),
    Hostile(
        "a report claiming 10 billion pixels",
        "forged",
        _forge(
            "json.dumps({'images': [{'width': 100000, 'height': 100000, 'source_width': "
            "100000, 'source_height': 100000}], 'text': None, 'printed': '', 'notes': []})"
        ),
        ("not the model's view", "pixels together"),
    ),
    Hostile(
        "pixels short of the sizes",
        "forged",
        _forge(
            "json.dumps({'images': [{'width': 56, 'height': 56, 'source_width': 56, "
            "'source_height': 56}], 'text': None, 'printed': '', 'notes': []})"
        ),
        ("where the sizes say 9408",),
    ),
    Hostile(
        "a report of the wrong types",
        "forged",
        _forge(
            "json.dumps({'images': [{'width': '10', 'height': -1}], 'text': 5, "
            "'printed': [], 'notes': {}})"
        ),
        ("integers from 1",),
    ),
    # -- images whose view would be larger than what the code saved (the third review) ----
    Hostile(
        "a 4,000,000 x 1 PNG (shown on the grid: 4,571,432 x 28)",
        "views",
        "from PIL import Image\n"
        f"processed_path = '{OUT}/thin.png'\n"
        "Image.new('RGB', (4_000_000, 1), (9, 9, 9)).save(processed_path)",
        ("aspect ratio is over 200",),
    ),
    Hostile(
        "four forged thin views",
        "views",
        "import os, json\n"
        "thin = {'width': 142856, 'height': 28, 'source_width': 4_000_000, 'source_height': 1}\n"
        "head = json.dumps({'images': [thin] * 4, 'text': None, 'printed': '', 'notes': []})\n"
        f"os.write({RESULT_FD}, head.encode() + b'\\n')\n"
        "for _ in range(4):\n"
        f"    os.write({RESULT_FD}, b'\\0' * (3 * 142856 * 28))\n"
        "os._exit(0)",
        ("not the model's view", "wrote more than"),
    ),
    Hostile(
        "a forged view over what the trajectory may be shown",
        "views",
        "import os, json\n"
        "big = {'width': 3584, 'height': 3584, 'source_width': 3584, 'source_height': 3584}\n"
        "head = json.dumps({'images': [big], 'text': None, 'printed': '', 'notes': []})\n"
        f"os.write({RESULT_FD}, head.encode() + b'\\n' + b'\\0' * (3 * 3584 * 3584))\n"
        "os._exit(0)",
        ("pixels together", "wrote more than"),
    ),
    Hostile(
        "four images as large as may be saved",
        "views",
        "from PIL import Image\n"
        "for i in range(4):\n"
        f"    Image.new('RGB', (1000, 1000), (i, 9, 9)).save(f'{OUT}/big{{i}}.png')\n"
        f"    print(f'{OUT}/big{{i}}.png')",
        ("image(s) returned",),
    ),
    Hostile(
        "nine unreadable files named before an image",
        "views",
        "from PIL import Image\n"
        "for i in range(9):\n"
        f"    open(f'{OUT}/bad{{i}}.png', 'w').write('no image')\n"
        f"    print(f'{OUT}/bad{{i}}.png')\n"
        f"Image.new('RGB', (60, 40)).save('{OUT}/good.png')\n"
        f"print('{OUT}/good.png')",
        ("2 more image(s) left out",),
    ),
    # -- names and exit codes that broke the host ------------------------------------------
    Hostile(
        "a 300-character name",
        "names",
        f"open('{OUT}/' + 'a' * 300 + '.png', 'w')",
        ("File name too long", "No such file"),
    ),
    Hostile(
        "a NUL in a named path",
        "names",
        f"processed_path = '{OUT}/a\\x00b.png'",
        ("does not exist",),
    ),
    Hostile(
        "a loop of links printed as a path",
        "names",
        f"print('{OUT}/loop.png')",
        ("does not exist",),
    ),
    Hostile("exit code 200", "names", "import os\nos._exit(200)", ("exit 200",)),
    Hostile("exit code 137", "names", "import os\nos._exit(137)", ("exit 137",)),  # not SIGKILL
    Hostile("a SIGKILL of its own", "names", "import os\nos.kill(os.getpid(), 9)", ("SIGKILL",)),
    Hostile(
        "a forged status record, then a crash",
        "names",
        "import os, ctypes\n"
        'head = \'{"images": [], "text": "forged", "printed": "", "notes": []}\'\n'
        f"os.write({RESULT_FD}, head.encode() + b'\\n\\n\\x00speceyes-status 00000000\\n')\n"
        "ctypes.string_at(0)",
        ("SIGSEGV",),
    ),
    Hostile(
        "its result channel made non-blocking, then a crash",
        "names",
        "import os, fcntl, ctypes\n"
        f"fcntl.fcntl({RESULT_FD}, fcntl.F_SETFL, os.O_NONBLOCK)\n"
        f"os.write({RESULT_FD}, b'x' * 65536 + b'\\n\\x00speceyes-status 00000000\\n')\n"
        "ctypes.string_at(0)",
        ("SIGSEGV",),
    ),
    Hostile(
        "a header of 400,000 empty objects",
        "forged",
        _forge("'{\"images\": [], \"x\": [' + '{},' * 400000 + '{}]}'"),
        ("no report line within",),
    ),
    Hostile("a segmentation fault", "names", "import ctypes\nctypes.string_at(0)", ("SIGSEGV",)),
    # -- control characters and surrogates ------------------------------------------------
    Hostile(
        "terminal escapes, NUL and CR",
        "text",
        "print('\\x1b[2J\\x1b[31mred\\x00\\r\\x07\\x9bend')",
        ("[2J[31mredend",),
    ),
    Hostile("a lone surrogate", "text", "print('\\ud800 and \\udfff')", ("\ufffd and \ufffd",)),
    Hostile(
        "invalid UTF-8 and escapes on stderr, then a crash",
        "text",
        "import os\nos.write(2, b'\\xff\\xfe\\x1b[2J')\nos._exit(3)",
        ("exit 3",),
    ),
    Hostile(
        "a long run of path characters",
        "text",
        f"print('{OUT}/x' * 3000)",
        ("handed nothing back",),
    ),
)
