// The English text `tprun init-model` learns its tiny tokenizers from: image
// prompts of the kind FLUX.1 is given (subjects, styles, lighting, camera
// terms), plus lines that cover every ASCII letter, digit and common
// punctuation mark so that ordinary prompts never hit the unknown token.
// Written for tprun; changing a line changes every tokenizer init-model makes.

#include "presets/tokenizer_files.h"

#include <iterator>

namespace tprun::presets {

namespace {

constexpr const char* kCorpusLines[] = {
    "A photo of a cat sitting on a windowsill, soft morning light.",
    "A red fox running through fresh snow in a quiet pine forest.",
    "Portrait of an old fisherman with a grey beard, dramatic lighting, 85mm lens.",
    "A majestic lion resting on a rock at sunset, highly detailed, 8k.",
    "An astronaut riding a horse on the surface of the moon, digital art.",
    "A cozy wooden cabin in the mountains during a snowstorm, warm light in the windows.",
    "A bowl of ramen with a soft boiled egg, steam rising, food photography.",
    "A futuristic city skyline at night with neon signs and flying cars.",
    "Watercolor painting of a lighthouse on a rocky coast, stormy sea.",
    "A tiny robot watering a flower in a garden, cute, 3D render.",
    "Close-up of a dew drop on a green leaf, macro photography, shallow depth of field.",
    "A medieval castle on a hill surrounded by fog, fantasy illustration.",
    "A golden retriever puppy playing with a ball on the beach.",
    "An oil painting of a vase of sunflowers on a wooden table.",
    "A steaming cup of coffee next to an open book, rainy afternoon, cinematic.",
    "A dragon flying over a volcano, epic scene, concept art.",
    "A street market in Marrakesh with colorful spices and lanterns.",
    "A snowy owl perched on a branch, winter, wildlife photography.",
    "Minimalist poster of a mountain range with a pink and orange gradient sky.",
    "A vintage car parked in front of a diner, 1950s, film grain.",
    "A girl with a red umbrella walking in the rain, reflections on the street.",
    "A herd of elephants crossing a river in the savanna at dawn.",
    "An underwater scene with coral reefs, tropical fish and sun rays.",
    "A samurai standing in a bamboo forest, ink drawing, black and white.",
    "A slice of chocolate cake with strawberries on a white plate.",
    "A spaceship landing on an alien planet with two moons in the sky.",
    "A knight in shining armor holding a sword, studio lighting, portrait.",
    "A field of lavender under a blue sky with white clouds, Provence, summer.",
    "The northern lights over a frozen lake in Norway, long exposure.",
    "A busy train station in Tokyo during rush hour, motion blur.",
    "A hummingbird drinking nectar from a purple flower, high speed photo.",
    "Isometric illustration of a small island with a house and palm trees.",
    "A portrait of a woman with freckles and curly hair, natural light.",
    "A pirate ship sailing through huge waves under a full moon.",
    "A bookshelf full of old leather books in a dusty library.",
    "A bicycle leaning against a brick wall covered in ivy.",
    "An abstract painting with bold shapes in yellow, blue and black.",
    "A wolf howling at the moon on a snowy mountain ridge.",
    "A plate of sushi on a black slate, top view, studio photo.",
    "A child flying a kite in a green meadow on a windy day.",
    "A glass of orange juice on a kitchen counter, bright and fresh.",
    "A waterfall in a lush jungle with mist and rainbows.",
    "A cyberpunk hacker in a dark room lit by computer screens.",
    "Pencil sketch of a sleeping dog curled up on a rug.",
    "A hot air balloon floating over a valley at sunrise.",
    "A squirrel holding an acorn, sharp focus, blurred background.",
    "A modern living room with large windows, a grey sofa and plants.",
    "A lonely tree on a hill under a starry night sky, Milky Way.",
    "A bakery window with fresh bread, croissants and pastries.",
    "A tiger walking through tall grass, golden hour, National Geographic style.",
    "A jellyfish glowing in the deep ocean, bioluminescent, dark blue.",
    "A chess board with wooden pieces, dramatic side light.",
    "A snow-covered village with Christmas lights at dusk.",
    "A panda eating bamboo in a misty forest.",
    "Low poly render of a fox, pastel colors, white background.",
    "A violin resting on sheet music, warm candle light.",
    "An ancient temple hidden in the jungle, overgrown with vines.",
    "A close-up of a blue eye with long lashes, extreme detail.",
    "A sailboat on a calm lake reflecting pink clouds at sunset.",
    "A steampunk airship with brass gears and propellers.",
    "A farmer's market with baskets of apples, pears and pumpkins in autumn.",
    "A koala sleeping in a eucalyptus tree.",
    "A desert landscape with sand dunes and a camel caravan.",
    "A cup of green tea with cherry blossoms, spring, Japanese style.",
    "Don't forget: it's a quiet, empty road; we'll drive at night (and listen to jazz).",
    "Photo of a neon sign that reads \"OPEN 24/7\" on a wet street at 2 AM.",
    "A poster with the words QUICK BROWN FOX JUMPS OVER THE LAZY DOG in bold letters.",
    "Vintage typewriter text: \"The year is 1984, page 12 of 300.\"",
    "A robot holding a sign: 100% happy! #1 fan @ the zoo & park.",
    "Quiet village, jazz band, vivid zebra, wax figures, kayak, yellow jacket, exquisite quartz.",
    "Price tag: $19.99 + tax = $21.50; weight ~ 2.5 kg; size 10x20 cm.",
    "Question: who painted this? Answer: Vincent van Gogh (1853-1890).",
    "Keywords: sharp, detailed, 4k, HDR, RAW, DSLR, bokeh, f/1.8, ISO 100.",
    "Jumping kangaroo, frozen yak, zigzag pattern, vintage jukebox, whisky bottle.",
    "An Xbox controller, a Zeppelin, a Viking helmet and a UFO over Quebec.",
    "Birthday cake with candles shaped like 0 1 2 3 4 5 6 7 8 9.",
    "A detailed map of an imaginary kingdom with rivers, roads and cities.",
    "A macro shot of a butterfly wing, iridescent scales, very sharp.",
    "Two cats and three dogs sleeping together on a big red couch.",
    "A young man playing guitar by a campfire under the stars.",
    "A rainy window with drops of water and city lights behind it, bokeh.",
    "A portrait of a smiling grandmother baking cookies in her kitchen.",
    "A crowded beach in summer seen from above, drone photo.",
    "A mysterious door in the middle of a forest, glowing light inside.",
    "A screen showing code: x[i] = {a * b} <tag> snake_case | path\\dir ^ `tick`.",
};

}  // namespace

const std::vector<std::string>& bundled_corpus() {
  static const std::vector<std::string> lines(std::begin(kCorpusLines), std::end(kCorpusLines));
  return lines;
}

}  // namespace tprun::presets
