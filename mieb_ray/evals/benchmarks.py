"""MIEB's benchmarks by the names mteb 2.26.24 gives them (`mteb.get_benchmark(name).tasks`, in its order), so that
`--tasks "MIEB(lite)"` needs no mteb import to resolve (tests/unit/evals/test_benchmarks.py keeps them equal)."""

from __future__ import annotations

MULTILINGUAL = (
    'Birdsnap', 'Caltech101', 'CIFAR10', 'CIFAR100', 'Country211', 'DTD', 'EuroSAT', 'FER2013', 'FGVCAircraft',
    'Food101Classification', 'GTSRB', 'Imagenet1k', 'MNIST', 'OxfordFlowersClassification', 'OxfordPets',
    'PatchCamelyon', 'RESISC45', 'StanfordCars', 'STL10', 'SUN397', 'UCF101', 'VOC2007', 'CIFAR10Clustering',
    'CIFAR100Clustering', 'ImageNetDog15Clustering', 'ImageNet10Clustering', 'TinyImageNetClustering',
    'BirdsnapZeroShot', 'Caltech101ZeroShot', 'CIFAR10ZeroShot', 'CIFAR100ZeroShot', 'CLEVRZeroShot',
    'CLEVRCountZeroShot', 'Country211ZeroShot', 'DTDZeroShot', 'EuroSATZeroShot', 'FER2013ZeroShot',
    'FGVCAircraftZeroShot', 'Food101ZeroShot', 'GTSRBZeroShot', 'Imagenet1kZeroShot', 'MNISTZeroShot',
    'OxfordPetsZeroShot', 'PatchCamelyonZeroShot', 'RenderedSST2', 'RESISC45ZeroShot', 'StanfordCarsZeroShot',
    'STL10ZeroShot', 'SUN397ZeroShot', 'UCF101ZeroShot', 'BLINKIT2IMultiChoice', 'BLINKIT2TMultiChoice',
    'CVBenchCount', 'CVBenchRelation', 'CVBenchDepth', 'CVBenchDistance', 'AROCocoOrder', 'AROFlickrOrder',
    'AROVisualAttribution', 'AROVisualRelation', 'SugarCrepe', 'Winoground', 'ImageCoDe', 'STS12VisualSTS',
    'STS13VisualSTS', 'STS14VisualSTS', 'STS15VisualSTS', 'STS16VisualSTS', 'BLINKIT2IRetrieval',
    'BLINKIT2TRetrieval', 'CIRRIT2IRetrieval', 'CUB200I2IRetrieval', 'EDIST2ITRetrieval', 'Fashion200kI2TRetrieval',
    'Fashion200kT2IRetrieval', 'FashionIQIT2IRetrieval', 'Flickr30kI2TRetrieval', 'Flickr30kT2IRetrieval',
    'FORBI2IRetrieval', 'GLDv2I2IRetrieval', 'GLDv2I2TRetrieval', 'HatefulMemesI2TRetrieval',
    'HatefulMemesT2IRetrieval', 'ImageCoDeT2IRetrieval', 'InfoSeekIT2ITRetrieval', 'InfoSeekIT2TRetrieval',
    'MemotionI2TRetrieval', 'MemotionT2IRetrieval', 'METI2IRetrieval', 'MSCOCOI2TRetrieval', 'MSCOCOT2IRetrieval',
    'NIGHTSI2IRetrieval', 'OVENIT2ITRetrieval', 'OVENIT2TRetrieval', 'ROxfordEasyI2IRetrieval',
    'ROxfordMediumI2IRetrieval', 'ROxfordHardI2IRetrieval', 'RP2kI2IRetrieval', 'RParisEasyI2IRetrieval',
    'RParisMediumI2IRetrieval', 'RParisHardI2IRetrieval', 'SciMMIRI2TRetrieval', 'SciMMIRT2IRetrieval',
    'SketchyI2IRetrieval', 'SOPI2IRetrieval', 'StanfordCarsI2IRetrieval', 'TUBerlinT2IRetrieval',
    'VidoreArxivQARetrieval', 'VidoreDocVQARetrieval', 'VidoreInfoVQARetrieval', 'VidoreTabfquadRetrieval',
    'VidoreTatdqaRetrieval', 'VidoreShiftProjectRetrieval', 'VidoreSyntheticDocQAAIRetrieval',
    'VidoreSyntheticDocQAEnergyRetrieval', 'VidoreSyntheticDocQAGovernmentReportsRetrieval',
    'VidoreSyntheticDocQAHealthcareIndustryRetrieval', 'VisualNewsI2TRetrieval', 'VisualNewsT2IRetrieval',
    'VizWizIT2TRetrieval', 'VQA2IT2TRetrieval', 'WebQAT2ITRetrieval', 'WebQAT2TRetrieval', 'WITT2IRetrieval',
    'XFlickr30kCoT2IRetrieval', 'XM3600T2IRetrieval', 'VisualSTS17Eng', 'VisualSTS-b-Eng',
    'VisualSTS17Multilingual', 'VisualSTS-b-Multilingual',
)
_NOT_ENG = ('WITT2IRetrieval', 'XFlickr30kCoT2IRetrieval', 'XM3600T2IRetrieval', 'VisualSTS17Multilingual',
            'VisualSTS-b-Multilingual')
LITE = (
    'Country211', 'DTD', 'EuroSAT', 'GTSRB', 'OxfordPets', 'PatchCamelyon', 'RESISC45', 'SUN397',
    'ImageNetDog15Clustering', 'TinyImageNetClustering', 'CIFAR100ZeroShot', 'Country211ZeroShot',
    'FER2013ZeroShot', 'FGVCAircraftZeroShot', 'Food101ZeroShot', 'OxfordPetsZeroShot', 'StanfordCarsZeroShot',
    'BLINKIT2IMultiChoice', 'CVBenchCount', 'CVBenchRelation', 'CVBenchDepth', 'CVBenchDistance', 'AROCocoOrder',
    'AROFlickrOrder', 'AROVisualAttribution', 'AROVisualRelation', 'Winoground', 'ImageCoDe', 'STS13VisualSTS',
    'STS15VisualSTS', 'VisualSTS17Multilingual', 'VisualSTS-b-Multilingual', 'CIRRIT2IRetrieval',
    'CUB200I2IRetrieval', 'Fashion200kI2TRetrieval', 'HatefulMemesI2TRetrieval', 'InfoSeekIT2TRetrieval',
    'NIGHTSI2IRetrieval', 'OVENIT2TRetrieval', 'RP2kI2IRetrieval', 'VidoreDocVQARetrieval',
    'VidoreInfoVQARetrieval', 'VidoreTabfquadRetrieval', 'VidoreTatdqaRetrieval', 'VidoreShiftProjectRetrieval',
    'VidoreSyntheticDocQAAIRetrieval', 'VisualNewsI2TRetrieval', 'VQA2IT2TRetrieval', 'WebQAT2ITRetrieval',
    'WITT2IRetrieval', 'XM3600T2IRetrieval',
)
IMG = (
    'CUB200I2IRetrieval', 'FORBI2IRetrieval', 'GLDv2I2IRetrieval', 'METI2IRetrieval', 'NIGHTSI2IRetrieval',
    'ROxfordEasyI2IRetrieval', 'ROxfordMediumI2IRetrieval', 'ROxfordHardI2IRetrieval', 'RP2kI2IRetrieval',
    'RParisEasyI2IRetrieval', 'RParisMediumI2IRetrieval', 'RParisHardI2IRetrieval', 'SketchyI2IRetrieval',
    'SOPI2IRetrieval', 'StanfordCarsI2IRetrieval', 'Birdsnap', 'Caltech101', 'CIFAR10', 'CIFAR100', 'Country211',
    'DTD', 'EuroSAT', 'FER2013', 'FGVCAircraft', 'Food101Classification', 'GTSRB', 'Imagenet1k', 'MNIST',
    'OxfordFlowersClassification', 'OxfordPets', 'PatchCamelyon', 'RESISC45', 'StanfordCars', 'STL10', 'SUN397',
    'UCF101', 'CIFAR10Clustering', 'CIFAR100Clustering', 'ImageNetDog15Clustering', 'ImageNet10Clustering',
    'TinyImageNetClustering', 'VOC2007', 'STS12VisualSTS', 'STS13VisualSTS', 'STS14VisualSTS', 'STS15VisualSTS',
    'STS16VisualSTS', 'STS17MultilingualVisualSTS', 'STSBenchmarkMultilingualVisualSTS',
)
BENCHMARKS = {"MIEB(Multilingual)": MULTILINGUAL, "MIEB(eng)": tuple(t for t in MULTILINGUAL if t not in _NOT_ENG),
              "MIEB(lite)": LITE, "MIEB(Img)": IMG}
# every task of the four: MIEB(Multilingual)'s 130, and the two multilingual VisualSTS tasks MIEB(Img) runs as they
# are (MIEB(Multilingual) runs them inside its aggregates VisualSTS17Multilingual and VisualSTS-b-Multilingual)
TASKS = tuple(dict.fromkeys(t for tasks in BENCHMARKS.values() for t in tasks))
