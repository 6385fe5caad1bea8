"""Small local copies of the evaluation tasks, in the hub's schema of each task's evaluated split:
offline sample data for the tests, scripts/bench_eval.py and a first try of ``python -m eval``.

    python -m eval.samples DIR     # writes DIR/<task>.jsonl for every task in eval.tasks.TASKS
    python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper --data-dir DIR
    python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper --samples   # the two in one (samples_dir)

    rows = write_fixtures(Path(DIR))   # the same from Python
    names = write_harness_tasks(Path(INCLUDE), Path(DIR))   # lm-eval task YAMLs reading those files

`python -m eval --data-dir DIR` and Task.load_docs(DIR) read them. A handful of examples per task:
a check that evaluation runs, offline, not a benchmark. The texts are varied, natural
English written for these files (not copied from the datasets), so a small model scores them
non-trivially; every value is fixed (no randomness). They cover the harness's special cases: ARC
items with numeric labels and five choices and with three choices, HellaSwag WikiHow contexts
with " [title]", "[header]"/"[step]" tags and double spaces, a LAMBADA word of several GPT-2
tokens ("Nebuchadnezzar"), a WikiText page of several hundred words with its markup (" @-@ ",
" @,@ ", " = = Heading = = ", " , ", " 's", " ° "), RACE articles with several problems
(fill-in-the-blank ones included) stored as the hub stores them (a Python literal string),
WSC word-index spans, WinoGrande blanks.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from atomic import atomic_write

# ----------------------------------------------------------------------------------- LAMBADA
# EleutherAI/lambada_openai (default, test): {"text": str}; the last word is the target.
LAMBADA = [
    "The old professor asked the class who had built the hanging gardens of Babylon. Nobody raised a hand, "
    "so he wrote the name on the board, letter by letter: Nebuchadnezzar. \"He was a king who conquered "
    "Jerusalem,\" he said, \"and he built those gardens for a queen who missed the green hills of her home.\" "
    "At the end of the lesson he pointed at the board once more and asked who had built the gardens, and "
    "this time the whole class answered together, Nebuchadnezzar",
    "Maria had spent the whole summer repairing the little wooden boat her grandfather had left her. She "
    "sanded the hull, painted it a deep blue and sewed a new sail from two old bed sheets. On the first calm "
    "morning of September she carried the oars down to the lake, pushed off from the dock and, for the first "
    "time in her life, rowed out alone in her boat",
    "When the power went out, Tom searched every drawer in the kitchen for something to light the room. He "
    "found rubber bands, old receipts and a broken watch, but no torch. Then his sister remembered the box "
    "of birthday things in the hall cupboard, and a minute later they were sitting at the table in the warm "
    "yellow glow of a single candle",
    "The detective knelt beside the muddy footprints that led from the garden gate to the kitchen door. They "
    "were small, hardly larger than a child's, and they stopped right beneath the open pantry window. He "
    "looked up at the narrow frame, then at the thick ivy climbing the wall, and said quietly that whoever "
    "had come in had climbed the ivy and slipped through the window",
    "Every evening the baker kept back the loaves that had not sold and carried them to the shelter at the "
    "end of the street. The children there waited for him on the steps, and the youngest always asked "
    "whether he had remembered the sweet one with raisins. He never forgot, and every night he handed her "
    "the warm raisin loaf",
    "Samuel trained for the marathon for eleven months, running before dawn through rain and snow. On the "
    "day of the race his knee began to ache at the twentieth mile, but he thought of his father waiting at "
    "the finish and kept going. When he finally crossed the line, limping and exhausted, his father wrapped "
    "him in a blanket and told him how proud he was of his son",
]

# ----------------------------------------------------------------------------------- WikiText
# EleutherAI/wikitext_document_level (wikitext-2-raw-v1, test): {"page": str}, the raw lines
# (" = Title = \n", " \n", " text \n") of one article joined, tokenized the WikiText way.
WIKITEXT = [
    " = Harwick Point Lighthouse = \n \n"
    " Harwick Point Lighthouse is a disused lighthouse on the northern headland of Harwick Bay , on the "
    "east coast of England . It was designed by the engineer Thomas Aldridge , built between 1821 and 1824 , "
    "and guided ships past the sandbanks at the mouth of the bay for more than a century . The tower is 31 @.@ "
    "5 metres ( 103 ft ) tall and stands on a low cliff about 18 metres above the sea . It has been a listed "
    "building since 1972 and now houses a small museum of local maritime history . \n \n"
    " = = History = = \n \n"
    " Before the lighthouse was built , the only warning for ships entering the bay was a coal fire kept "
    "burning on the headland by the keepers of a nearby farm . After three colliers were wrecked on the "
    "sandbanks during a single storm in 1818 , the merchants of the town petitioned for a proper light , and "
    "the work was finally approved in 1820 . The total cost of the tower , the keepers ' cottages and the "
    "boundary wall was £ 4 @,@ 870 , a large sum at the time . \n \n"
    " = = = Construction = = = \n \n"
    " The stone for the tower was quarried about twelve miles inland and carried to the headland on carts "
    "pulled by oxen . Aldridge 's workers laid the foundations on solid rock , and the walls are nearly two "
    "metres thick at the base . The builders worked only in summer , because winter gales made the cliff top "
    "too dangerous . A cast @-@ iron lantern , made in Newcastle , was lifted into place in the autumn of "
    "1824 , and the light was first shown on 1 December of that year . \n \n"
    " = = = Keepers = = = \n \n"
    " For most of its working life the lighthouse was staffed by a principal keeper and two assistants , who "
    "lived with their families in the cottages beside the tower . The keepers ' logbooks , which survive in "
    "the county archive , record the weather every four hours , the ships that passed , and the quantity of "
    "oil burned each night . In the hard winter of 1895 the temperature on the headland fell to −14 ° C , and "
    "the keepers had to thaw the oil by the kitchen stove before they could light the lamp . \n \n"
    " = = Decline and restoration = = \n \n"
    " The light was made automatic in 1931 and the keepers left the following spring . As the sandbanks "
    "shifted further south , a new light @-@ vessel was anchored off the bay in 1956 , and the old tower was "
    "finally switched off in 1959 . For several years it stood empty and its windows were broken by storms . "
    "In 1974 a group of local volunteers formed a trust , repaired the lantern room and opened the lower "
    "floors to visitors . The museum 's collection includes the original clockwork that turned the lens , "
    "several of the keepers ' logbooks and a model of the collier Mary Ellen , which was lost on the "
    "sandbanks in 1818 . About 20 @,@ 000 people visit the lighthouse each year . \n",
    " = Common Swift = \n \n"
    " The common swift is a medium @-@ sized bird that spends almost its whole life in the air . It feeds , "
    "drinks and even sleeps on the wing , and a young swift may not land for two or three years after it "
    "leaves the nest . Swifts arrive in northern Europe in late April or May and leave again in early "
    "August , flying south to spend the winter over central and southern Africa . \n \n"
    " = = Breeding = = \n \n"
    " Swifts nest in holes under roof tiles , in church towers and in old walls . A pair usually returns to "
    "the same site every year and lays two or three white eggs . Both parents feed the chicks on balls of "
    "insects gathered in their throats , each ball holding several hundred small flies . \n",
    " = The Glass Orchard = \n \n"
    " The Glass Orchard is a 1987 novel by the Welsh writer Eleri Vaughan . It tells the story of a widowed "
    "clockmaker who moves to a remote valley and slowly rebuilds his life by restoring an abandoned "
    "greenhouse . The novel was praised for its quiet humour and its descriptions of the changing seasons , "
    "and it won the Cardiff Book Prize in 1988 . \n \n"
    " = = Reception = = \n \n"
    " Critics compared Vaughan 's patient style to that of Thomas Hardy , although one reviewer found the "
    "ending \" too neat for a book that had been so honest about grief \" . The novel has been translated into "
    "eleven languages and was adapted for radio in 1995 . \n",
    " = River Leddon = \n \n"
    " The River Leddon is a short river in the west of England . It rises in low hills near the village of "
    "Ashcombe and flows south for about 19 kilometres ( 12 mi ) before it joins the River Severn . For much "
    "of its course it runs through farmland , and several old water mills stand along its banks ; two of them "
    "were still grinding flour in the 1930s . \n \n"
    " The river is known for its brown trout , and the fishing rights are managed by a local angling club . "
    "Otters returned to the Leddon in the early 2000s after an absence of more than forty years . \n",
    " = Battle of Carrow Ford = \n \n"
    " The Battle of Carrow Ford was fought on 14 June 1643 near the village of Carrow , during the First "
    "English Civil War . A Royalist force of about 2 @,@ 500 men tried to cross the river at the ford but was "
    "held back by Parliamentarian musketeers hidden in the hedges on the far bank . After three hours of "
    "fighting the Royalists withdrew , leaving their baggage train behind . \n \n"
    " = = Aftermath = = \n \n"
    " The battle was small , but it kept the road to the coast open for Parliament for the rest of the "
    "summer . A stone marking the site of the ford was put up by the parish in 1893 . \n",
]


# ----------------------------------------------------------------------------------- ARC
# allenai/ai2_arc (ARC-Easy / ARC-Challenge, test): id, question, choices {text, label}, answerKey.
def _arc(id_: str, question: str, texts: list[str], answer: int, numeric: bool = False) -> dict:
    labels = [str(i + 1) if numeric else "ABCDE"[i] for i in range(len(texts))]
    return {"id": id_, "question": question, "choices": {"text": texts, "label": labels},
            "answerKey": labels[answer]}


ARC_EASY = [
    _arc("Mercury_7001", "Which of these is a source of light?",
         ["a mirror", "the Moon", "a candle flame", "a window"], 2),
    _arc("MCAS_2004_5_12", "Which part of a plant takes in water from the soil?",
         ["roots", "leaves", "flowers", "seeds", "fruit"], 0, numeric=True),
    _arc("NYSEDREGENTS_2010_4_3", "What happens to water when it freezes?",
         ["It becomes a solid.", "It becomes a gas.", "It disappears."], 0),
    _arc("Mercury_7044", "A student pushes a toy car across the floor. What makes the car slow down and stop?",
         ["gravity pulling it up", "friction with the floor", "the color of the car", "magnetism"], 1),
    _arc("MDSA_2008_5_20", "Which animal is a mammal?",
         ["a frog", "a shark", "a whale", "a lizard"], 2, numeric=True),
    _arc("Mercury_7112", "Why do people wear light-colored clothes in hot weather?",
         ["Light colors reflect more sunlight.", "Light colors are heavier.",
          "Light colors absorb more heat.", "Light colors keep out the rain."], 0),
]

ARC_CHALLENGE = [
    _arc("Mercury_SC_7201", "A ball is dropped from a tall building. Which statement best describes the ball "
         "as it falls?", ["Its speed stays the same.", "Its speed increases.", "Its mass increases.",
                          "Its weight decreases."], 1),
    _arc("Mercury_SC_7233", "Which process in the water cycle is most directly powered by energy from the Sun?",
         ["condensation", "precipitation", "evaporation", "runoff"], 2),
    _arc("NYSEDREGENTS_2013_8_14", "Which change would most likely increase the number of rabbits in a meadow?",
         ["an increase in the number of foxes", "a decrease in the amount of grass",
          "a decrease in the number of hawks", "a long period of drought", "a cold winter"], 2, numeric=True),
    _arc("Mercury_SC_7310", "Which tool would a scientist use to observe the cells of an onion skin?",
         ["a telescope", "a microscope", "a thermometer"], 1),
    _arc("MCAS_2012_8_22", "Why does a metal spoon feel colder than a wooden spoon at the same temperature?",
         ["Metal conducts heat away from the hand faster.", "Metal is always colder than wood.",
          "Wood produces its own heat.", "Metal absorbs light."], 0, numeric=True),
]


# ----------------------------------------------------------------------------------- HellaSwag
# Rowan/hellaswag (validation): ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id, split,
# split_type, label (a string).
def _hellaswag(ind: int, activity: str, ctx_a: str, ctx_b: str, endings: list[str], label: int,
               source_id: str, split_type: str = "indomain") -> dict:
    return {"ind": ind, "activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": (ctx_a + " " + ctx_b).strip(), "endings": endings, "source_id": source_id, "split": "val",
            "split_type": split_type, "label": str(label)}


HELLASWAG = [
    _hellaswag(24, "Washing dishes", "A woman stands at a kitchen sink full of soapy water.", "she",
               ["scrubs a plate with a sponge and rinses it under the tap.",
                "throws the plates out of the window one by one.",
                "starts playing a guitar while sitting on the roof.",
                "paints the sink a bright shade of green."], 0, "activitynet~v_dish01"),
    _hellaswag(92, "Playing violin", "A young man tucks a violin under his chin and lifts the bow.", "he",
               ["puts the violin in the oven and closes the door.",
                "draws the bow across the strings and begins to play a slow tune.",
                "rides a bicycle down a steep hill.", "folds the violin into a paper airplane."],
               1, "activitynet~v_violin7"),
    _hellaswag(1054, "Home and Garden",
               "[header] How to plant tulip bulbs [title] Choose a sunny spot.  [step] Tulips need at least six "
               "hours of sunlight a day. [title] Dig a hole about three times as deep as the bulb.", "",
               ["[step] Place the bulb in the hole with the pointed end up, then cover it with soil.",
                "[step] Paint the bulb blue so that it grows faster.  [substeps] Use waterproof paint.",
                "[step] Put the bulb in the freezer for a year before you dig the hole.",
                "[step] Throw the bulb as far as you can and wait for it to sprout."],
               0, "wikihow~1834", "zeroshot"),
    _hellaswag(2210, "Food and Entertaining",
               "[header] How to make iced tea [title] Boil water in a kettle. [step] Pour it over four tea "
               "bags in a heatproof jug.", "[substeps] Let",
               ["the jug fly to the moon for an hour.",
                "the tea steep for about five minutes, then remove the bags and let it cool.",
                "the dog drink all of the boiling water.",
                "the tea bags dry in the sun for a week before using them."],
               1, "wikihow~40213", "indomain"),
    _hellaswag(3307, "Snow shoveling", "A man in a thick coat steps out of his front door into deep snow.",
               "he",
               ["jumps into a swimming pool and swims laps.",
                "mows the lawn with a red lawnmower.",
                "picks up a shovel and starts clearing a path to the street.",
                "sits down and reads a newspaper in the sun."], 2, "activitynet~v_snow22"),
    _hellaswag(4120, "Personal Care and Style",
               "[header] How to tie a tie [title] Drape the tie around your neck.  [step] The wide end should "
               "hang about twelve inches lower than the narrow end.", "",
               ["[title] Cut the tie in half with scissors.  [step] Throw both pieces away.",
                "[title] Put the tie in the washing machine.",
                "[title] Iron the tie while you are wearing it.",
                "[title] Cross the wide end over the narrow end.  [step] Then bring it up through the loop "
                "around your neck."], 3, "wikihow~77410", "zeroshot"),
]

# ----------------------------------------------------------------------------------- PIQA
# baber/piqa (validation): goal, sol1, sol2, label (int).
PIQA = [
    {"goal": "How do I keep bread fresh for longer?",
     "sol1": "Store it in a sealed bag in a cool, dry place.", "sol2": "Store it in a bowl of warm water.",
     "label": 0},
    {"goal": "To open a jar with a stuck lid,",
     "sol1": "pour cold juice on the label and shake the jar.",
     "sol2": "run the lid under hot water for a minute, then twist it.", "label": 1},
    {"goal": "How can I dry wet shoes quickly?",
     "sol1": "Stuff them with newspaper and leave them in a warm room.",
     "sol2": "Put them in the freezer overnight.", "label": 0},
    {"goal": "To remove a splinter from a finger,",
     "sol1": "hit the finger with a hammer until it comes out.",
     "sol2": "clean the skin and pull the splinter out gently with tweezers.", "label": 1},
    {"goal": "How do you stop a candle from dripping wax on the table?",
     "sol1": "Put the candle in a holder with a wide base.", "sol2": "Light both ends of the candle.",
     "label": 0},
    {"goal": "To make a paper airplane fly farther,",
     "sol1": "soak the paper in water before folding it.",
     "sol2": "fold the wings evenly and throw it with a smooth, level push.", "label": 1},
]

# ----------------------------------------------------------------------------------- WinoGrande
# allenai/winogrande (winogrande_xl, validation): sentence (with one "_"), option1, option2, answer ("1"/"2").
WINOGRANDE = [
    {"sentence": "The trophy would not fit in the suitcase because the _ was too big.",
     "option1": "trophy", "option2": "suitcase", "answer": "1"},
    {"sentence": "The trophy would not fit in the suitcase because the _ was too small.",
     "option1": "trophy", "option2": "suitcase", "answer": "2"},
    {"sentence": "Sarah lent her umbrella to Emily because _ was going to walk home in the rain.",
     "option1": "Sarah", "option2": "Emily", "answer": "2"},
    {"sentence": "The cat chased the mouse across the kitchen until the _ was too tired to run any further.",
     "option1": "cat", "option2": "mouse", "answer": "2"},
    {"sentence": "James practiced the piano every day while Robert never did, so _ won the competition.",
     "option1": "James", "option2": "Robert", "answer": "1"},
    {"sentence": "The ice melted faster on the plate than in the glass because the _ was in the sun.",
     "option1": "plate", "option2": "glass", "answer": "1"},
]

# ----------------------------------------------------------------------------------- SuperGLUE
# aps/super_glue (validation): the columns of each configuration, labels as ints, idx.
BOOLQ = [
    {"question": "is the pacific ocean larger than the atlantic ocean",
     "passage": "Pacific Ocean -- The Pacific Ocean is the largest and deepest of the Earth's oceans. It covers "
                "about a third of the planet's surface, more than all of its land put together, and is roughly "
                "twice the size of the Atlantic Ocean.", "idx": 0, "label": 1},
    {"question": "can penguins fly",
     "passage": "Penguin -- Penguins are a group of flightless seabirds that live almost entirely in the Southern "
                "Hemisphere. Their wings have evolved into flippers, which make them fast and agile swimmers "
                "but cannot lift them into the air.", "idx": 1, "label": 0},
    {"question": "is a tomato a fruit",
     "passage": "Tomato -- Botanically, the tomato is a fruit: it develops from the flower of the plant and "
                "contains its seeds. In cooking, however, it is usually treated as a vegetable and served in "
                "savoury dishes.", "idx": 2, "label": 1},
    {"question": "does the moon produce its own light",
     "passage": "Moonlight -- Moonlight is the light that reaches the Earth from the Moon. It is mostly sunlight "
                "reflected from the lunar surface; the Moon itself does not give off any visible light.",
     "idx": 3, "label": 0},
    {"question": "is mount everest the tallest mountain above sea level",
     "passage": "Mount Everest -- Mount Everest, on the border between Nepal and China, is the highest mountain "
                "on Earth above sea level, with a summit 8,849 metres high.", "idx": 4, "label": 1},
    {"question": "was the telephone invented in the twentieth century",
     "passage": "Telephone -- The first practical telephones were patented in the 1870s, and by the end of the "
                "nineteenth century telephone lines connected many of the large cities of Europe and North "
                "America.", "idx": 5, "label": 0},
]

# cb: label 0 entailment, 1 contradiction, 2 neutral.
CB = [
    {"premise": "Anna said she had finished the report before lunch, and she sent it to her manager straight "
                "away.", "hypothesis": "Anna finished the report", "idx": 0, "label": 0},
    {"premise": "The museum was closed all week for repairs, so nobody could see the new exhibition.",
     "hypothesis": "visitors saw the new exhibition that week", "idx": 1, "label": 1},
    {"premise": "I don't know whether Peter will come to the party. He said he might be working late.",
     "hypothesis": "Peter will come to the party", "idx": 2, "label": 2},
    {"premise": "The dog barked at the postman every morning until the family moved to a new house in the "
                "country.", "hypothesis": "the family moved to a new house", "idx": 3, "label": 0},
    {"premise": "She never learned to swim, although she grew up in a small town beside the sea.",
     "hypothesis": "she is a strong swimmer", "idx": 4, "label": 1},
    {"premise": "The letter was posted on Monday. It is hard to say when it will arrive, since the post office "
                "has been slow lately.", "hypothesis": "the letter will arrive on Wednesday", "idx": 5,
     "label": 2},
]

COPA = [
    {"premise": "The man broke his toe.", "choice1": "He dropped a hammer on his foot.",
     "choice2": "He got a hole in his sock.", "question": "cause", "idx": 0, "label": 0},
    {"premise": "The girl put on her coat.", "choice1": "It was warm outside.",
     "choice2": "It was cold outside.", "question": "cause", "idx": 1, "label": 1},
    {"premise": "The glass fell off the table.", "choice1": "It shattered on the floor.",
     "choice2": "It filled with water.", "question": "effect", "idx": 2, "label": 0},
    {"premise": "The sun went down.", "choice1": "The birds began to sing.",
     "choice2": "The sky grew dark.", "question": "effect", "idx": 3, "label": 1},
    {"premise": "The student studied all night.", "choice1": "He wanted to pass the exam.",
     "choice2": "He had already finished the course.", "question": "cause", "idx": 4, "label": 0},
    {"premise": "I left the ice cream on the counter.", "choice1": "It froze solid.",
     "choice2": "It melted.", "question": "effect", "idx": 5, "label": 1},
]

# rte: label 0 entailment, 1 not_entailment.
RTE = [
    {"premise": "The new bridge over the river was opened by the mayor on Saturday, after three years of "
                "construction.", "hypothesis": "The bridge took three years to build.", "idx": 0, "label": 0},
    {"premise": "Heavy rain caused flooding in several villages, and hundreds of people were moved to "
                "shelters.", "hypothesis": "There was no rain in the villages.", "idx": 1, "label": 1},
    {"premise": "The company, which makes bicycles, opened a second factory in Poland last year.",
     "hypothesis": "The company makes bicycles.", "idx": 2, "label": 0},
    {"premise": "The author wrote her first novel while working as a nurse in a city hospital.",
     "hypothesis": "The author has never worked in a hospital.", "idx": 3, "label": 1},
    {"premise": "After the concert, the band signed autographs for nearly two hours.",
     "hypothesis": "The band signed autographs after the concert.", "idx": 4, "label": 0},
    {"premise": "The library will extend its opening hours during the exam period.",
     "hypothesis": "The library is closing permanently.", "idx": 5, "label": 1},
]


def _wic(word: str, sentence1: str, form1: str, sentence2: str, form2: str, idx: int, label: int) -> dict:
    start1, start2 = sentence1.index(form1), sentence2.index(form2)
    return {"word": word, "sentence1": sentence1, "sentence2": sentence2, "start1": start1,
            "start2": start2, "end1": start1 + len(form1), "end2": start2 + len(form2), "idx": idx,
            "label": label}


WIC = [
    _wic("bank", "She sat on the bank of the river.", "bank", "He deposited the money in the bank.", "bank", 0, 0),
    _wic("run", "He runs a small bakery downtown.", "runs", "She runs the family business.", "runs", 1, 1),
    _wic("light", "The box was light enough to carry.", "light", "Turn on the light, please.", "light", 2, 0),
    _wic("play", "The children play in the park after school.", "play",
         "We watched the kids play football on the beach.", "play", 3, 1),
    _wic("bark", "The bark of the old oak was rough.", "bark", "The dog's bark woke the baby.", "bark", 4, 0),
    _wic("break", "Don't break the glass.", "break", "Be careful not to break that vase.", "break", 5, 1),
]


def _wsc(marked: str, idx: int, label: int) -> dict:
    """A WSC row from a text whose noun is marked [like this] and pronoun <like this>; the indices
    count space-separated words, as the hub's do."""
    words = marked.split(" ")
    span1 = next(i for i, w in enumerate(words) if w.startswith("["))
    span2 = next(i for i, w in enumerate(words) if w.startswith("<"))
    span1_text = re.search(r"\[(.*?)\]", marked).group(1)
    span2_text = re.search(r"<(.*?)>", marked).group(1)
    return {"text": re.sub(r"[\[\]<>]", "", marked), "span1_index": span1, "span2_index": span2,
            "span1_text": span1_text, "span2_text": span2_text, "idx": idx, "label": label}


WSC = [
    _wsc("[Mark] told Pete many lies about himself , which Pete included in his book . <He> should have been "
         "more truthful .", 0, 1),
    _wsc("The city councilmen refused [the demonstrators] a permit because <they> feared violence .", 1, 0),
    _wsc("[The trophy] doesn't fit into the brown suitcase because <it> is too large .", 2, 1),
    _wsc("Joan made sure to thank [Susan] for all the help <she> had given .", 3, 1),
    _wsc("[Paul] tried to call George on the phone , but <he> wasn't available .", 4, 0),
    _wsc("The man lifted [the boy] onto his shoulders because <he> was too short to see the parade .", 5, 1),
]


# ----------------------------------------------------------------------------------- RACE
# EleutherAI/race (high, test): article, problems (a Python literal string of
# [{'answer': letter, 'options': [4 strings], 'question': str}, ...]).
def _race(article: str, problems: list[tuple[str, list[str], str]]) -> dict:
    return {"article": article,
            "problems": repr([{"answer": a, "options": o, "question": q} for q, o, a in problems])}


RACE = [
    _race("Lisa moved to a new town when she was twelve. On her first day at school she did not know anyone, "
          "and at lunch she sat alone in the corner of the dining hall. A girl called Amy noticed her and came "
          "over with her tray. \"Can I sit here?\" she asked. They talked about books and found that they both "
          "loved stories about horses. By the end of the week they were walking home together every afternoon. "
          "Years later, Lisa still says that the best thing about moving was meeting Amy.",
          [("Why did Lisa sit alone at lunch on her first day?",
            ["She did not like the food.", "She did not know anyone at the school.",
             "She wanted to read a book.", "She was angry with Amy."], "B"),
           ("What did Lisa and Amy both love?",
            ["stories about horses", "playing football", "cooking lunch", "walking in the rain"], "A"),
           ("The best title for the passage would be  _  .",
            ["A Day at the Farm", "How to Choose a School", "A New Friend", "Lunch in the Dining Hall"], "C")]),
    _race("Many people think that camels store water in their humps, but this is not true. A camel's hump is "
          "full of fat, which the animal can use for energy when food is hard to find. Camels can go for a week "
          "or more without drinking, because their bodies lose very little water. When they do find water, they "
          "can drink more than one hundred litres in a few minutes. Their thick fur also protects them from the "
          "heat of the desert sun during the day and keeps them warm during the cold nights.",
          [("What is stored in a camel's hump?", ["water", "fat", "milk", "air"], "B"),
           ("According to the passage, camels can go without drinking for  _  .",
            ["an hour", "a day", "a week or more", "a year"], "C"),
           ("Which of the following is TRUE about camels' fur?",
            ["It makes them hotter during the day.", "It falls out in the desert.",
             "It protects them from heat and cold.", "It stores water for the night."], "C"),
           ("What is the passage mainly about?",
            ["how camels survive in the desert", "why people ride camels", "where camels sleep",
             "how to cross a desert"], "A")]),
    _race("The town library was built in 1905 with money from a local businessman. For most of the last "
          "century it was a quiet place where people came to borrow books and read newspapers. Today it is much "
          "busier. It offers free computer classes for older people, homework clubs for children and a "
          "weekly language cafe where newcomers can practise English. The head librarian says that the library "
          "has become \"the living room of the town\", a place where everyone is welcome.",
          [("Who paid for the library to be built?",
            ["the town council", "a local businessman", "the head librarian", "a group of teachers"], "B"),
           ("What does the head librarian mean by \"the living room of the town\"?",
            ["The library sells furniture.", "People sleep in the library.",
             "The library is a welcoming place for everyone.", "The library is closed at night."], "C")]),
    _race("Every spring, volunteers in the village of Marsh End spend a weekend cleaning the beach. Last year "
          "more than two hundred people took part. They collected over a thousand plastic bottles, hundreds of "
          "pieces of fishing net and even an old bicycle. The organiser, a retired teacher, started the event "
          "ten years ago after she found a seabird caught in a plastic bag. \"If everyone picks up a little, "
          "the beach stays beautiful for all of us,\" she says.",
          [("Why did the organiser start the beach cleaning?",
            ["She wanted to find an old bicycle.", "She found a seabird caught in a plastic bag.",
             "She needed money for the village.", "She wanted to become a teacher."], "B"),
           ("How many people took part last year?",
            ["about fifty", "about one hundred", "more than two hundred", "more than a thousand"], "C"),
           ("From the passage we can learn that the organiser  _  .",
            ["is still working at a school", "cares about the environment",
             "lives far from the sea", "sells fishing nets"], "B")]),
    _race("Thomas Edison is remembered as one of the greatest inventors in history, but as a boy he spent only "
          "a few months at school. His mother taught him at home, and he read every book he could find. At "
          "twelve he sold newspapers on trains and used a corner of a baggage car as a small laboratory. Later "
          "he set up a workshop where teams of workers tested thousands of ideas. Edison once said that genius "
          "is one per cent inspiration and ninety-nine per cent perspiration.",
          [("Who taught Edison when he was a boy?",
            ["his father", "his mother", "a famous scientist", "a train driver"], "B"),
           ("Edison's famous saying shows that he believed success comes mainly from  _  .",
            ["luck", "hard work", "money", "good teachers"], "B")]),
]

FIXTURES: dict[str, list[dict]] = {
    "lambada_openai": [{"text": text} for text in LAMBADA],
    "wikitext": [{"page": page} for page in WIKITEXT],
    "arc_easy": ARC_EASY, "arc_challenge": ARC_CHALLENGE, "hellaswag": HELLASWAG, "piqa": PIQA,
    "winogrande": WINOGRANDE, "race": RACE, "boolq": BOOLQ, "cb": CB, "copa": COPA, "rte": RTE,
    "wic": WIC, "wsc": WSC,
}


def write_fixtures(data_dir: Path) -> dict[str, list[dict]]:
    """Write <data_dir>/<task>.jsonl for every task (one hub row a line); return the rows by task.
    A file that already holds its rows is left as it is, its mtime too: datasets keys its cache of
    a local file by path and mtime, so writing the same samples again reuses that cache."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    for task, rows in FIXTURES.items():
        path = data_dir / f"{task}.jsonl"
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            with atomic_write(path, "w") as f:
                f.write(text)
    return json.loads(json.dumps(FIXTURES))  # a copy the caller may change


def samples_dir() -> Path:
    """The sample tasks, written (as write_fixtures does) into a folder of datasets' cache
    (HF_DATASETS_CACHE), beside its copies of them: where ``python -m eval --samples`` reads them."""
    import datasets

    data_dir = Path(datasets.config.HF_DATASETS_CACHE) / "nanomerit_eval_samples"
    write_fixtures(data_dir)
    return data_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m eval.samples",
        description="Write the sample tasks, <DIR>/<task>.jsonl for every task of `python -m eval` in the "
                    "hub's schema (a handful of examples each: a check that evaluation runs offline, not a "
                    "benchmark), and print the command that evaluates a checkpoint on them.")
    parser.add_argument("dir", type=Path, help="the folder to write them into (made if missing)")
    args = parser.parse_args(argv)
    try:
        rows = write_fixtures(args.dir)
    except OSError as error:
        sys.exit(f"eval.samples: cannot write the sample tasks into {args.dir}: {error}")
    print(f"wrote {len(rows)} sample tasks into {args.dir}:")
    width = max(len(task) for task in rows) + len(".jsonl")
    for task, task_rows in rows.items():
        print(f"  {task + '.jsonl':<{width}}  {len(task_rows)} examples")
    print("evaluate a checkpoint on them (no hub needed):")
    print(f"  python -m eval --ckpt runs/NAME/ckpt.pt --tasks paper --data-dir {shlex.quote(str(args.dir))}")


HARNESS_YAMLS = {  # our task -> the harness's YAML, relative to lm_eval/tasks
    "lambada_openai": "lambada/lambada_openai.yaml", "wikitext": "wikitext/wikitext.yaml",
    "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "winogrande": "winogrande/default.yaml",
    "race": "race/race.yaml", "boolq": "super_glue/boolq/default.yaml", "cb": "super_glue/cb/default.yaml",
    "copa": "super_glue/copa/default.yaml", "rte": "super_glue/rte/default.yaml",
    "wic": "super_glue/wic/default.yaml", "wsc": "super_glue/wsc/default.yaml",
}
SPLIT_KEYS = ("training_split", "validation_split", "test_split")


def write_harness_tasks(include_dir: Path, data_dir: Path) -> dict[str, tuple[dict, str]]:
    """For every task, an lm-eval task YAML in include_dir that includes the harness's own YAML
    (by absolute path: its !function references still resolve) with the data pointed at
    <data_dir>/<task>.jsonl; returns {our task: (the harness's YAML config, the fixture task's
    name)}. Load them with lm_eval.tasks.TaskManager(include_path=include_dir)."""
    import yaml
    from lm_eval import tasks as harness_tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    tasks_dir = Path(harness_tasks.__file__).parent
    include_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, rel in HARNESS_YAMLS.items():
        config = load_yaml(tasks_dir / rel, resolve_func=False)
        split = config.get("test_split") or config.get("validation_split")
        # Splits the fixture lacks are set to null, or the harness would load them at construction.
        override = {"include": str(tasks_dir / rel), "task": f"{name}_fixture", "dataset_path": "json",
                    "dataset_name": None, "dataset_kwargs": {"data_files": {split: str(data_dir / f"{name}.jsonl")}},
                    **{key: None for key in SPLIT_KEYS if config.get(key) != split}}
        with atomic_write(include_dir / f"{name}_fixture.yaml", "w") as f:
            f.write(yaml.safe_dump(override))
        written[name] = (config, f"{name}_fixture")
    return written


if __name__ == "__main__":
    main()
