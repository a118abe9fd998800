<?php
// php-memcached's getMulti of 150 and of 300 values of 1 MB through the
// proxy, TRIES times each: every value, every time (proxy_memory.rs stored
// big:<i> = "<i:07>|" repeated to 1,000,000 bytes).
//
// usage: php -d memory_limit=-1 php_large_get_multi.php HOST:PORT TRIES
[$host, $port] = explode(':', $argv[1]);
$tries = (int) $argv[2];
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, false);
$m->addServer($host, (int) $port);
$value = fn(int $i) => substr(str_repeat(sprintf('%07d|', $i), 125000), 0, 1000000);
foreach ([150, 300] as $n) {
    $keys = array_map(fn($i) => "big:$i", range(0, $n - 1));
    for ($t = 0; $t < $tries; $t++) {
        $got = $m->getMulti($keys);
        if ($got === false) {
            fwrite(STDERR, "$n values, try $t: getMulti() false: " . $m->getResultMessage() . "\n");
            exit(1);
        }
        $bad = 0;
        foreach ($keys as $i => $k) {
            if (!isset($got[$k]) || $got[$k] !== $value($i)) {
                $bad++;
            }
        }
        if ($bad > 0) {
            fwrite(STDERR, "$n values, try $t: $bad missing or wrong\n");
            exit(1);
        }
    }
}
echo "php-memcached getMulti: 150 and 300 values of 1 MB, $tries tries each, every value every time\n";
