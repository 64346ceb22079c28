from PIL import Image
side = 1000
for i in range(4):
    path = '/mnt/data/temp_processed_images/v%d.png' % i
    Image.new('RGB', (side, side), (i * 60, 0, 0)).save(path)
    print(path)
# four plain images that fill the pixel budget (image_pixels) are cheap to write and
# each becomes up to 16,384 visual tokens on the model's grid: the text cap
# (sandbox_text_chars) bounds printed text only, so one execution with the default
# limits (40,000,000 pixels) still appends ~49,000 tokens to the conversation
