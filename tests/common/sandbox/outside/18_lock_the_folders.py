folder = '/mnt/data/locked'
os.makedirs('/mnt/data/temp_processed_images', exist_ok=True)
os.makedirs(folder + '/a/b/c', exist_ok=True)
open(folder + '/a/b/c/f', 'w').write('x')
for path in (folder + '/a/b/c', folder + '/a/b', folder + '/a', folder):
    os.chmod(path, 0)
os.chmod('/mnt/data/temp_processed_images', 0)
os.chmod('/tmp', 0)
os.chmod('/mnt/data', 0)
print('locked')
# takes every right away on its folders and a tree below them (so the next execution
# of the session cannot even chdir into /mnt/data): the worker must still remove it
# all and the next job must run as ever
